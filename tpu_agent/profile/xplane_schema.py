"""The XSpace protobuf schema (``tensorflow.profiler`` package), built at import time.

Neither the ``xprof`` nor the ``tensorboard-plugin-profile`` wheel ships ``xplane_pb2``, and generating one
would need ``protoc``. The schema is small and stable (it is the on-disk format every XProf version
reads), so the seven message descriptors are declared here with ``descriptor_pb2`` and turned into
message classes with ``message_factory``. Field numbers follow ``xla/tsl/profiler/protobuf/xplane.proto``.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "tensorflow.profiler"

# message name -> [(field name, number, type, label, type_name, oneof index)]
_MESSAGES: dict[str, list[tuple[str, int, int, int, str, int | None]]] = {
    "XSpace": [
        ("planes", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "XPlane", None),
        ("errors", 2, _F.TYPE_STRING, _F.LABEL_REPEATED, "", None),
        ("warnings", 3, _F.TYPE_STRING, _F.LABEL_REPEATED, "", None),
        ("hostnames", 4, _F.TYPE_STRING, _F.LABEL_REPEATED, "", None),
    ],
    "XPlane": [
        ("id", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "", None),
        ("lines", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "XLine", None),
        ("event_metadata", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "XPlane.EventMetadataEntry", None),
        ("stat_metadata", 5, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "XPlane.StatMetadataEntry", None),
        ("stats", 6, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "XStat", None),
    ],
    "XLine": [
        ("id", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("display_id", 10, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "", None),
        ("display_name", 11, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "", None),
        ("timestamp_ns", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("duration_ps", 9, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("events", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "XEvent", None),
    ],
    "XEvent": [
        ("metadata_id", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("offset_ps", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", 0),
        ("num_occurrences", 5, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", 0),
        ("duration_ps", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("stats", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "XStat", None),
    ],
    "XStat": [
        ("metadata_id", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("double_value", 2, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, "", 0),
        ("uint64_value", 3, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, "", 0),
        ("int64_value", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", 0),
        ("str_value", 5, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "", 0),
        ("bytes_value", 6, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, "", 0),
        ("ref_value", 7, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, "", 0),
    ],
    "XEventMetadata": [
        ("id", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "", None),
        ("metadata", 3, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, "", None),
        ("display_name", 4, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "", None),
        ("stats", 5, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "XStat", None),
        ("child_id", 6, _F.TYPE_INT64, _F.LABEL_REPEATED, "", None),
    ],
    "XStatMetadata": [
        ("id", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None),
        ("name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "", None),
        ("description", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "", None),
    ],
}
_ONEOFS = {"XEvent": ["data"], "XStat": ["value"]}
_MAP_ENTRIES = {"EventMetadataEntry": "XEventMetadata", "StatMetadataEntry": "XStatMetadata"}


def _add_field(message: descriptor_pb2.DescriptorProto, spec: tuple[str, int, int, int, str, int | None]) -> None:
    name, number, ftype, label, type_name, oneof = spec
    field = message.field.add(name=name, number=number, type=ftype, label=label)
    if type_name:
        field.type_name = f".{_PACKAGE}.{type_name}"
    if oneof is not None:
        field.oneof_index = oneof


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="tpu_agent/profile/xplane.proto", package=_PACKAGE, syntax="proto3")
    for name, specs in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for oneof_name in _ONEOFS.get(name, []):
            message.oneof_decl.add(name=oneof_name)
        for spec in specs:
            _add_field(message, spec)
        if name == "XPlane":
            for entry_name, value_type in _MAP_ENTRIES.items():
                entry = message.nested_type.add(name=entry_name)
                entry.options.map_entry = True
                _add_field(entry, ("key", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, "", None))
                _add_field(entry, ("value", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, value_type, None))
    return proto


# A private pool: another library registering the real xplane.proto in the default pool cannot clash.
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_build_file())


def _message_class(name: str) -> type:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


XSpace = _message_class("XSpace")
XPlane = _message_class("XPlane")
XLine = _message_class("XLine")
XEvent = _message_class("XEvent")
XStat = _message_class("XStat")
XEventMetadata = _message_class("XEventMetadata")
XStatMetadata = _message_class("XStatMetadata")

__all__ = ["XSpace", "XPlane", "XLine", "XEvent", "XStat", "XEventMetadata", "XStatMetadata"]
