import os

# Progress bars are for people; tests read stdout/stderr.
os.environ.setdefault("RDPP_NO_PROGRESS", "1")
