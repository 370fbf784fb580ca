"""Split a list of records into pages for the listing API."""


def page_count(total, per_page):
    """Number of pages needed to show ``total`` items, ``per_page`` at a time."""
    if per_page < 1:
        raise ValueError("per_page must be at least 1")
    return total // per_page


def paginate(items, page, per_page=10):
    """The items on ``page`` (1-based); a page past the end is empty."""
    if page < 1 or per_page < 1:
        raise ValueError("page and per_page must be at least 1")
    start = page * per_page
    return list(items[start : start + per_page])


def page_window(page, pages, width=5):
    """Up to ``width`` consecutive page numbers around ``page``, within 1..pages."""
    if pages <= 0:
        return []
    width = min(width, pages)
    first = page - width // 2
    first = max(1, min(first, pages - width))
    return list(range(first, first + width))
