"""Package build ordering."""


class CycleError(ValueError):
    def __init__(self, cycle):
        super().__init__("dependency cycle: " + " -> ".join(cycle))
        self.cycle = cycle


def build_order(deps):
    raise NotImplementedError
