"""Framing of the mlxd protocol: ``encode`` / ``decode`` and ``ProtocolError``.

Contract:
    * A frame is one msgpack map holding ``"v"`` (the protocol version, an int), ``"type"`` (the
      message's ``TYPE``) and the message's fields by name. Strings are msgpack str, never bin;
      frames over ``MAX_FRAME_BYTES`` are refused.
    * ``decode(frame)`` returns a message from ``messages`` or raises ``ProtocolError`` carrying
      one of the error codes (defined in ``messages``) and, when the frame had a string "id", that
      id; it never raises anything else, whatever the bytes.
    * ``encode(message)`` applies the checks ``decode`` applies, so whatever ``encode`` accepts,
      ``decode`` accepts and turns back into an equal message.
"""

from typing import Any

import msgpack

from .field_checks import FieldError, build, check_instance, field_specs, type_name
from .messages import (
    BAD_FRAME,
    BAD_VERSION,
    INVALID,
    MAX_FRAME_BYTES,
    MAX_ID_CHARS,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    UNKNOWN_TYPE,
    Error,
    Message,
)

UNPACK_PIECE_BYTES = 64 * 1024  # a larger frame is unpacked piece by piece (``_unpack``)


class ProtocolError(Exception):
    """A frame or message that breaks the protocol.

    Attributes:
        code: One of the error codes of ``messages``.
        message: What was wrong, for a human.
        request_id: The offending frame's id when it could be read, so the reply can carry it.
    """

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id

    def to_reply(self, request_id: str | None = None) -> Error:
        """Build the Error reply for this problem.

        Args:
            request_id: Id to answer under; defaults to the id read from the bad frame.

        Returns:
            An ``Error`` carrying this error's code and message.
        """
        return Error(id=request_id if request_id is not None else self.request_id, code=self.code, message=self.message)


def error_reply(code: str, message: str, id: str | None = None) -> Error:
    """Build an Error reply.

    Args:
        code: One of the error codes of ``messages``.
        message: What went wrong, for a human.
        id: The request's id (None only when it could not be read).

    Returns:
        The ``Error`` message.
    """
    return Error(id=id, code=code, message=message)


def _check_id(message: Message) -> None:
    request_id = getattr(message, "id", None)
    if request_id is not None and not 0 < len(request_id) <= MAX_ID_CHARS:
        raise FieldError(f"id: must be 1 to {MAX_ID_CHARS} characters")


def _to_wire(message: Message) -> dict[str, Any]:
    specs = field_specs(type(message))  # type: ignore[arg-type]  # a class is hashable
    return {name: _wire_value(getattr(message, name)) for name, _, _ in specs}


def _wire_value(value: Any) -> Any:
    # nested messages (Sampling, Speculative, a Tick's rows) travel as maps
    if isinstance(value, Message):
        return _to_wire(value)
    if type(value) is list and value and isinstance(value[0], Message):
        return [_wire_value(item) for item in value]
    return value


def _unencodable(error: Exception) -> str:
    if isinstance(error, UnicodeEncodeError):
        return "a string holds a lone surrogate (not valid Unicode text)"
    if isinstance(error, OverflowError):
        return "an integer is outside the 64-bit range [-2^63, 2^64)"
    if "recursion" in str(error) or "depth" in str(error):
        return "a value is nested too deeply"
    return "a value cannot be carried by the protocol (only JSON-like values: maps, lists, strings, numbers)"


def encode(message: Message) -> bytes:
    """Serialise a message into one frame.

    Args:
        message: A request or reply dataclass from ``messages``.

    Returns:
        The msgpack frame.

    Raises:
        TypeError: ``message`` is not a protocol message.
        ProtocolError: INVALID when a field breaks the rules ``decode`` enforces or a free-form value
            cannot be packed (a lone surrogate, an integer past 64 bits, nesting too deep); BAD_FRAME
            when the frame would exceed MAX_FRAME_BYTES.
    """
    cls = type(message)
    if MESSAGE_TYPES.get(getattr(cls, "TYPE", "")) is not cls:
        raise TypeError(f"not a protocol message: {cls.__name__}")
    try:
        check_instance(message)
        _check_id(message)
    except FieldError as error:
        raise ProtocolError(INVALID, f"{cls.TYPE}: {error}", getattr(message, "id", None)) from None
    try:
        frame = msgpack.packb({"v": PROTOCOL_VERSION, "type": cls.TYPE, **_to_wire(message)}, use_bin_type=True)
    except (UnicodeEncodeError, OverflowError, ValueError, TypeError) as error:
        # free-form values (chat messages, tools) are not checked field by field: msgpack finds a lone
        # surrogate, an integer past 64 bits, nesting past its depth limit or a value it cannot carry
        raise ProtocolError(INVALID, f"{cls.TYPE}: {_unencodable(error)}", getattr(message, "id", None)) from None
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(BAD_FRAME, f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    return frame


def _unpack(frame: bytes) -> Any:
    """The frame's msgpack value. A large frame is fed to msgpack in pieces, so a thread decoding it lets
    the others run in between (one call over megabytes would hold the GIL throughout)."""
    # strict_map_key stays off because logit_bias is keyed by token id (int); field_checks
    # refuses every other non-str key, and unhashable keys fail right here as a bad frame.
    if len(frame) <= UNPACK_PIECE_BYTES:
        return msgpack.unpackb(frame, raw=False, use_list=True, strict_map_key=False)
    unpacker = msgpack.Unpacker(raw=False, use_list=True, strict_map_key=False, max_buffer_size=len(frame))
    view = memoryview(frame)
    for start in range(0, len(frame), UNPACK_PIECE_BYTES):
        unpacker.feed(view[start : start + UNPACK_PIECE_BYTES])
        try:
            data = unpacker.unpack()
        except msgpack.OutOfData:
            continue
        if unpacker.tell() != len(frame):
            raise msgpack.ExtraData(data, b"")
        return data
    raise msgpack.OutOfData("the frame ends inside a value")


def _unpack_problem(exc: Exception) -> str:
    if isinstance(exc, msgpack.ExtraData):
        return "ExtraData: bytes after the message"
    return f"{type(exc).__name__}: {exc}"


def decode(frame: bytes) -> Message:
    """Parse and check one frame.

    Args:
        frame: The bytes of one ZeroMQ message part.

    Returns:
        The message dataclass named by the frame's "type".

    Raises:
        ProtocolError: BAD_FRAME, BAD_VERSION, UNKNOWN_TYPE or INVALID; its ``request_id`` is the
            frame's id when that was a string, so the Error reply can carry it.
    """
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise ProtocolError(BAD_FRAME, f"a frame is bytes, got {type_name(frame)}")
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(BAD_FRAME, f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        data = _unpack(frame)
    except Exception as exc:  # msgpack raises many types: ValueError, FormatError, TypeError, ...
        raise ProtocolError(BAD_FRAME, f"not a msgpack frame ({_unpack_problem(exc)})") from None
    if type(data) is not dict:
        raise ProtocolError(BAD_FRAME, f"a frame is a msgpack map, got {type_name(data)}")
    # The id to answer under: only one the reply itself could carry.
    raw_id = data.get("id")
    request_id = raw_id if type(raw_id) is str and 0 < len(raw_id) <= MAX_ID_CHARS else None
    version = data.get("v")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        got = repr(version) if "v" in data else "missing"
        supported = ", ".join(map(str, sorted(SUPPORTED_VERSIONS)))
        raise ProtocolError(BAD_VERSION, f"protocol version {got}; supported: {supported}", request_id)
    type_tag = data.get("type")
    cls = MESSAGE_TYPES.get(type_tag) if type(type_tag) is str else None
    if cls is None:
        known = ", ".join(sorted(MESSAGE_TYPES))
        raise ProtocolError(UNKNOWN_TYPE, f"unknown message type {type_tag!r}; known: {known}", request_id)
    try:
        message = build(cls, {key: value for key, value in data.items() if key not in ("v", "type")})
        _check_id(message)
    except FieldError as error:
        raise ProtocolError(INVALID, f"{cls.TYPE}: {error}", request_id) from None
    return message
