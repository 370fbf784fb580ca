"""A tiny shopping basket used by the checkout service."""


class Basket:
    def __init__(self, items=[]):
        self.items = items

    def add(self, name, price, quantity=1):
        if quantity < 1:
            raise ValueError("quantity must be at least 1")
        self.items.append((name, price, quantity))
        return self

    def total(self):
        return round(sum(price * quantity for _, price, quantity in self.items), 2)

    def count(self):
        return sum(quantity for _, _, quantity in self.items)


def tag_order(basket, tags=[]):
    """Tags describing an order: the given ones plus computed ones."""
    if basket.count() >= 10:
        tags.append("bulk")
    if basket.total() >= 100:
        tags.append("free-shipping")
    if not basket.items:
        tags.append("empty")
    return tags
