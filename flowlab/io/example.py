"""``tf.train.Example`` and its parts as protobuf messages (``fl.train.Example``, ``fl.train.Features``,
``fl.train.Feature``, ``fl.train.BytesList``, ``fl.train.FloatList``, ``fl.train.Int64List``, and
``SequenceExample``, ``FeatureList``, ``FeatureLists``).

The message classes come from the ``protobuf`` package, built at first use from a descriptor
written here: the same package name (``tensorflow``), message names, field numbers and types as
TensorFlow's ``example.proto`` and ``feature.proto``, so an Example serialized here is the same
bytes TensorFlow would write, and TensorFlow's records parse here. They live in a private
descriptor pool, so they never clash with TensorFlow's own classes if both are imported.

The schema, in proto3::

    message BytesList { repeated bytes value = 1; }
    message FloatList { repeated float value = 1 [packed = true]; }
    message Int64List { repeated int64 value = 1 [packed = true]; }
    message Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                   Int64List int64_list = 3; } }
    message Features { map<string, Feature> feature = 1; }
    message FeatureList { repeated Feature feature = 1; }
    message FeatureLists { map<string, FeatureList> feature_list = 1; }
    message Example { Features features = 1; }
    message SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }

>>> import flowlab as fl
>>> ex = fl.train.Example(features=fl.train.Features(feature={
...     "label": fl.train.Feature(int64_list=fl.train.Int64List(value=[3]))}))
>>> data = ex.SerializeToString()
>>> fl.train.Example.FromString(data).features.feature["label"].int64_list.value[0]
3
"""
from __future__ import annotations

import threading

__all__ = ["MESSAGES", "message_class", "Example", "Features", "Feature", "BytesList", "FloatList",
           "Int64List", "FeatureList", "FeatureLists", "SequenceExample"]

MESSAGES = ("BytesList", "FloatList", "Int64List", "Feature", "Features", "FeatureList", "FeatureLists",
            "Example", "SequenceExample")
_PACKAGE = "tensorflow"
_classes: dict = {}
_lock = threading.Lock()


def _import_protobuf():
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool
    except ImportError:
        raise ImportError("fl.train.Example and fl.io.parse_example need the 'protobuf' package, a "
                          "dependency of flowlab: pip install protobuf") from None
    return descriptor_pb2, descriptor_pool


def _file_descriptors(descriptor_pb2):
    """TensorFlow's feature.proto and example.proto, as FileDescriptorProto messages."""
    F = descriptor_pb2.FieldDescriptorProto
    OPTIONAL, REPEATED = F.LABEL_OPTIONAL, F.LABEL_REPEATED

    def field(message, name, number, kind, label=OPTIONAL, type_name=None, oneof=None, packed=None):
        f = message.field.add(name=name, number=number, type=kind, label=label, json_name=_camel(name))
        if type_name:
            f.type_name = f".{_PACKAGE}.{type_name}"
        if oneof is not None:
            f.oneof_index = oneof
        if packed is not None:
            f.options.packed = packed
        return f

    def map_field(message, name, value_type):
        entry = message.nested_type.add(name=_camel(name, upper=True) + "Entry")
        entry.options.map_entry = True
        field(entry, "key", 1, F.TYPE_STRING)
        field(entry, "value", 2, F.TYPE_MESSAGE, type_name=value_type)
        f = message.field.add(name=name, number=1, type=F.TYPE_MESSAGE, label=REPEATED, json_name=_camel(name))
        f.type_name = f".{_PACKAGE}.{message.name}.{entry.name}"

    feature = descriptor_pb2.FileDescriptorProto(name="tensorflow/core/example/feature.proto",
                                                 package=_PACKAGE, syntax="proto3")
    field(feature.message_type.add(name="BytesList"), "value", 1, F.TYPE_BYTES, REPEATED)
    field(feature.message_type.add(name="FloatList"), "value", 1, F.TYPE_FLOAT, REPEATED, packed=True)
    field(feature.message_type.add(name="Int64List"), "value", 1, F.TYPE_INT64, REPEATED, packed=True)
    one = feature.message_type.add(name="Feature")
    one.oneof_decl.add(name="kind")
    field(one, "bytes_list", 1, F.TYPE_MESSAGE, type_name="BytesList", oneof=0)
    field(one, "float_list", 2, F.TYPE_MESSAGE, type_name="FloatList", oneof=0)
    field(one, "int64_list", 3, F.TYPE_MESSAGE, type_name="Int64List", oneof=0)
    map_field(feature.message_type.add(name="Features"), "feature", "Feature")
    field(feature.message_type.add(name="FeatureList"), "feature", 1, F.TYPE_MESSAGE, REPEATED, "Feature")
    map_field(feature.message_type.add(name="FeatureLists"), "feature_list", "FeatureList")

    example = descriptor_pb2.FileDescriptorProto(name="tensorflow/core/example/example.proto",
                                                 package=_PACKAGE, syntax="proto3",
                                                 dependency=[feature.name])
    field(example.message_type.add(name="Example"), "features", 1, F.TYPE_MESSAGE, type_name="Features")
    seq = example.message_type.add(name="SequenceExample")
    field(seq, "context", 1, F.TYPE_MESSAGE, type_name="Features")
    field(seq, "feature_lists", 2, F.TYPE_MESSAGE, type_name="FeatureLists")
    return feature, example


def _camel(name, upper=False):
    parts = name.split("_")
    head = parts[0].capitalize() if upper else parts[0]
    return head + "".join(p.capitalize() for p in parts[1:])


def _message_class(descriptor):
    try:
        from google.protobuf.message_factory import GetMessageClass       # protobuf >= 4.22
        return GetMessageClass(descriptor)
    except ImportError:                                                   # older protobuf
        from google.protobuf import message_factory
        return message_factory.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)


def _build():
    descriptor_pb2, descriptor_pool = _import_protobuf()
    pool = descriptor_pool.DescriptorPool()
    for proto in _file_descriptors(descriptor_pb2):
        pool.Add(proto)
    return {name: _message_class(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name in MESSAGES}


def message_class(name: str):
    """The protobuf class of message ``name`` (one of ``MESSAGES``), built on first use."""
    if not _classes:
        with _lock:
            if not _classes:
                _classes.update(_build())
    return _classes[name]


def __getattr__(name):
    if name in MESSAGES:
        cls = message_class(name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module 'flowlab.io.example' has no attribute {name!r}")
