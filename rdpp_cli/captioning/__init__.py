"""`rdpp caption`: caption image files with a model artifact (caption.py) and show them (contact_sheet.py)."""
