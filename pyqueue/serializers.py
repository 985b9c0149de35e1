"""Payload serializers, chosen by the message's ``payload_type`` tag.

Built in: ``json`` (any JSON-serializable object), ``text`` (``str``, UTF-8) and ``bytes``
(``bytes`` as is). Register more per payload type, for example a dataclass named ``Contact``::

    registry.register("Contact", encode=lambda c: json.dumps(asdict(c)).encode(),
                      decode=lambda b: Contact(**json.loads(b)))
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import limits
from .errors import InvalidArgument, PayloadDecodeError, UnknownPayloadType

Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes], Any]


def _json_encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


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
