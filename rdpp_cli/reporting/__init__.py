"""`rdpp table`: the comparison tables of a workspace's runs, read from their artifacts' files."""
