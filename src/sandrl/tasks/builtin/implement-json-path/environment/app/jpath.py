"""Dotted/bracketed paths into JSON documents."""


def get_path(doc, path, default=None):
    raise NotImplementedError


def leaf_paths(doc):
    raise NotImplementedError


def set_path(doc, path, value):
    raise NotImplementedError
