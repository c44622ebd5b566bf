"""End-to-end demo run by ``kestrel demo`` / ``make run``."""


def run_demo() -> int:
    raise NotImplementedError
