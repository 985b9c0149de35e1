"""Payload serializers, chosen by the message's ``payload_type`` tag.

Built in: ``json`` (any JSON-serializable object), ``text`` (``str``, UTF-8) and ``bytes``
(``bytes`` as is). Register more per payload type, for example a dataclass named ``Contact``::

    registry.register("Contact", encode=lambda c: json.dumps(asdict(c)).encode(),
                      decode=lambda b: Contact(**json.loads(b)))
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import limits
from .errors import InvalidArgument, PayloadDecodeError, UnknownPayloadType

Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes], Any]


def json_bytes(obj: Any, name: str = "payload") -> bytes:
    """``obj`` as compact JSON text in UTF-8, or :class:`InvalidArgument` (22023) where
    ``json.dumps`` would write text that is not JSON or cannot write any.

    What JSON holds is a dict, list, tuple, str, int, float, bool or None, nested; dict keys are
    written as strings (``1`` → ``"1"``, ``True`` → ``"true"``, ``None`` → ``"null"``). Refused:
    a NaN or infinite float (``json.dumps`` writes ``NaN``, which no JSON reader and no ``jsonb``
    takes), a dict whose keys collide once written as strings (``{1: "a", "1": "b"}``: an object
    with the same key twice), a value or key of another type (a set, bytes, a tuple key) and a
    container holding itself, a str with a lone surrogate (``"\\ud800"``: no UTF-8 for it). The
    message names ``name`` and the place, e.g.
    ``payload['a'][1] is nan, and JSON has no NaN or Infinity``.

    :param obj: the value to write.
    :param name: the parameter it came from (``payload``, ``headers``), for the message.
    :returns: the JSON text in UTF-8 (no spaces, non-ASCII characters as they are).
    :raises InvalidArgument: ``obj`` has no JSON text.
    """
    try:
        data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidArgument(_json_fault(obj, name) or f"{name} is not JSON: {exc}") from None
    if _keys_may_collide(obj):
        fault = _json_fault(obj, name)
        if fault is not None:
            raise InvalidArgument(fault)
    return data


_CONTAINERS = (dict, list, tuple)
_SCALARS = frozenset({str, int, float, bool, type(None)})
_NOT_JSON = "which JSON cannot hold (it holds dict, list, tuple, str, int, float, bool and None)"
_NO_NAN = "and JSON has no NaN or Infinity"
_NO_UTF8 = "which UTF-8 cannot encode"


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _keys_may_collide(obj: Any) -> bool:
    """Whether some dict in ``obj`` (already written by ``json.dumps``, so free of cycles) has a
    key that is not a str: only then can two keys be written as the same string. A value of an
    exact scalar type is skipped by a set lookup, which keeps a long list of numbers cheap (about
    a third of the time ``json.dumps`` takes)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            for key in o:
                if type(key) is not str:
                    return True
            stack.extend([v for v in o.values() if type(v) not in _SCALARS])
        elif isinstance(o, (list, tuple)):
            stack.extend([v for v in o if type(v) not in _SCALARS])
    return False


def _json_key(key: Any) -> str | None:
    """The string ``json.dumps`` writes for a dict key, or None for a key it refuses."""
    if isinstance(key, str):
        return str.__str__(key)  # a str subclass is written as its characters, whatever its __str__
    if key is True or key is False or key is None:
        return json.dumps(key)
    if isinstance(key, float):
        return float.__repr__(key) if math.isfinite(key) else None
    if isinstance(key, int):
        return int.__repr__(key)
    return None


def _json_fault(obj: Any, name: str) -> str | None:
    """The first place in ``obj`` that has no JSON text, described for a message, or None."""
    try:
        found = _fault_in(obj, set())
    except RecursionError:
        return f"{name} is nested too deeply to be written as JSON"
    if found is None:
        return None
    path, what = found
    return f"{name}{''.join(reversed(path))} {what}"


def _fault_in(obj: Any, on_path: set[int]) -> tuple[list[str], str] | None:
    """``(path, what)``: the subscripts to the first fault (innermost first) and what is wrong."""
    if isinstance(obj, str):
        return None if _utf8(obj) else ([], f"is a str with a lone surrogate, {_NO_UTF8}")
    if obj is None or isinstance(obj, int):  # bool is an int
        return None
    if isinstance(obj, float):
        return None if math.isfinite(obj) else ([], f"is {obj!r}, {_NO_NAN}")
    if not isinstance(obj, _CONTAINERS):
        return [], f"is a {type(obj).__name__}, {_NOT_JSON}"
    if id(obj) in on_path:
        return [], "contains itself"
    on_path.add(id(obj))
    try:
        if isinstance(obj, dict):
            written: dict[str, Any] = {}
            for key in obj:
                text = _json_key(key)
                if text is not None and not _utf8(text):
                    return [], f"has the key {key!r}, a str with a lone surrogate, {_NO_UTF8}"
                if text is None:
                    if isinstance(key, float):
                        return [], f"has the key {key!r}, {_NO_NAN}"
                    return [], (f"has the key {key!r}, a {type(key).__name__}; "
                                "JSON keys are str, int, float, bool or None")
                if text in written:
                    return [], f"has the keys {written[text]!r} and {key!r}, both {json.dumps(text)} in JSON"
                written[text] = key
            items: Any = obj.items()
        else:
            items = enumerate(obj)
        for sub, value in items:
            found = _fault_in(value, on_path)
            if found is not None:
                found[0].append(f"[{sub!r}]")
                return found
        return None
    finally:
        on_path.discard(id(obj))


def _json_encode(obj: Any) -> bytes:
    return json_bytes(obj)


def _json_decode(data: bytes) -> Any:
    return json.loads(data)


def _text_encode(obj: Any) -> bytes:
    if not isinstance(obj, str):
        raise InvalidArgument(f"payload_type 'text' needs a str payload, got {type(obj).__name__}")
    return obj.encode("utf-8")


def _bytes_encode(obj: Any) -> bytes:
    if not isinstance(obj, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"payload_type 'bytes' needs a bytes payload, got {type(obj).__name__}")
    return bytes(obj)


@dataclass
class SerializerRegistry:
    """Encoders and decoders by payload_type. Copy it to customise one queue only."""

    _encoders: dict[str, Encoder] = field(default_factory=dict)
    _decoders: dict[str, Decoder] = field(default_factory=dict)

    @classmethod
    def default(cls) -> SerializerRegistry:
        reg = cls()
        reg.register("json", _json_encode, _json_decode)
        reg.register("text", _text_encode, lambda b: b.decode("utf-8"))
        reg.register("bytes", _bytes_encode, bytes)
        return reg

    def copy(self) -> SerializerRegistry:
        return SerializerRegistry(dict(self._encoders), dict(self._decoders))

    def register(self, payload_type: str, encode: Encoder | None = None, decode: Decoder | None = None) -> None:
        """Register an encoder (object → bytes) and/or a decoder (bytes → object) for ``payload_type``
        (1 to :data:`pyqueue.limits.PAYLOAD_TYPE_CHARS` characters, else :class:`InvalidArgument`)."""
        if not payload_type or len(payload_type) > limits.PAYLOAD_TYPE_CHARS:
            raise InvalidArgument(f"payload_type must be 1 to {limits.PAYLOAD_TYPE_CHARS} characters")
        if encode is not None:
            self._encoders[payload_type] = encode
        if decode is not None:
            self._decoders[payload_type] = decode

    @staticmethod
    def infer_type(payload: Any) -> str:
        """The payload_type used when none is given: bytes → ``bytes``, str → ``text``, else ``json``."""
        if isinstance(payload, (bytes, bytearray, memoryview)):
            return "bytes"
        if isinstance(payload, str):
            return "text"
        return "json"

    def encode(self, payload: Any, payload_type: str | None) -> tuple[bytes, str]:
        """Return ``(bytes, payload_type)``; raises :class:`InvalidArgument` for an unknown type."""
        ptype = payload_type or self.infer_type(payload)
        enc = self._encoders.get(ptype)
        if enc is None:
            if isinstance(payload, (bytes, bytearray, memoryview)):
                return bytes(payload), ptype  # an application type tag on raw bytes
            raise InvalidArgument(
                f"no encoder registered for payload_type {ptype!r}; pass bytes or register one"
            )
        return enc(payload), ptype

    def decode(self, data: bytes, payload_type: str) -> Any:
        """Decode ``data``; raises :class:`UnknownPayloadType` or :class:`PayloadDecodeError`."""
        dec = self._decoders.get(payload_type)
        if dec is None:
            raise UnknownPayloadType(
                f"no decoder registered for payload_type {payload_type!r}; "
                "register one or read Message.raw_payload"
            )
        try:
            return dec(data)
        except Exception as exc:  # the decoder's own error, wrapped with the type named
            raise PayloadDecodeError(f"payload_type {payload_type!r}: cannot decode payload: {exc}") from exc


registry = SerializerRegistry.default()
"""The process-wide default registry used by queues created without their own."""
