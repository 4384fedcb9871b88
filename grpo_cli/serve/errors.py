"""The one exception the server's request handling raises (no imports: `grpo --help` stays fast)."""


class RequestError(Exception):
    """A request the server refuses: HTTP `status`, a message for people, the field it is about."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.field = status, field
