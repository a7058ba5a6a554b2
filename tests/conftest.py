"""Fixtures and hooks every test module shares; plain helper functions are in ``tests/helpers.py``.

Tiers (markers registered in pyproject.toml): every test is ``unit`` or ``integration``
(tests/test_tiers.py checks it); ``slow`` ones are left out by default; ``cuda`` ones are skipped
where torch sees no GPU.
"""

import os

# Progress bars are for people; tests read stdout/stderr.
os.environ.setdefault("RDPP_NO_PROGRESS", "1")
# One OpenMP thread in every process a test starts too (`rdpp` subprocesses inherit it): the tests' models
# are tiny, and on a 2-core machine two spinning OpenMP threads per process make them several times slower
# (tests/README.md). A value set outside pytest is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_runtest_setup(item):
    cuda = item.get_closest_marker("cuda")
    if cuda is not None and not torch.cuda.is_available():
        pytest.skip(cuda.kwargs.get("reason", "needs a CUDA GPU"))


@pytest.fixture(scope="session", autouse=True)
def _one_thread_per_run():
    """Every test runs with one intra-op thread (see ``one_thread``); results do not depend on it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_xe_workspace(tmp_path_factory):
    """Read-only: ``helpers.tiny_workspace`` with the small Att2in XE-trained for one epoch, built once for
    the session. A test module that writes into it uses ``tiny_xe_workspace_copy``."""
    from helpers import tiny_workspace

    return tiny_workspace(tmp_path_factory.mktemp("tiny-xe-shared"), xe_epochs=1)


@pytest.fixture(scope="module")
def tiny_xe_workspace_copy(tiny_xe_workspace, tmp_path_factory):
    """A copy of ``tiny_xe_workspace`` for one test module to write into (copying takes milliseconds)."""
    import shutil

    return shutil.copytree(tiny_xe_workspace, tmp_path_factory.mktemp("ws") / "ws")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny models: they run fastest on one, and on a shared
    2-core machine two spinning OpenMP threads make them 10-50x slower. Results do not depend on it.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
