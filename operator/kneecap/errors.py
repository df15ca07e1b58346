"""Errors shared by every layer."""


class InputError(ValueError):
    """Bad user input: names the field and what was expected. The CLI maps it to exit code 2."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")
