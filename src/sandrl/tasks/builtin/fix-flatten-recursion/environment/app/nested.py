"""Flatten nested payloads."""


def flatten(value, depth=None):
    if not hasattr(value, "__iter__"):
        return [value]
    out = []
    for item in value:
        if hasattr(item, "__iter__") and (depth is None or depth >= 0):
            out.extend(flatten(item, None if depth is None else depth - 1))
        else:
            out.append(item)
    return out
