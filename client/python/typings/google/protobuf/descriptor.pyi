# Part of google.protobuf.descriptor used by kvtier and its generated stubs.
from typing import ClassVar

class DescriptorBase:
    name: str
    full_name: str

class FieldDescriptor(DescriptorBase):
    TYPE_DOUBLE: ClassVar[int]
    TYPE_FLOAT: ClassVar[int]
    TYPE_INT64: ClassVar[int]
    TYPE_UINT64: ClassVar[int]
    TYPE_INT32: ClassVar[int]
    TYPE_BOOL: ClassVar[int]
    TYPE_STRING: ClassVar[int]
    TYPE_MESSAGE: ClassVar[int]
    TYPE_BYTES: ClassVar[int]
    TYPE_UINT32: ClassVar[int]
    TYPE_ENUM: ClassVar[int]
    CPPTYPE_INT32: ClassVar[int]
    CPPTYPE_INT64: ClassVar[int]
    CPPTYPE_UINT32: ClassVar[int]
    CPPTYPE_UINT64: ClassVar[int]
    CPPTYPE_DOUBLE: ClassVar[int]
    CPPTYPE_FLOAT: ClassVar[int]
    CPPTYPE_BOOL: ClassVar[int]
    CPPTYPE_ENUM: ClassVar[int]
    CPPTYPE_STRING: ClassVar[int]
    CPPTYPE_MESSAGE: ClassVar[int]
    LABEL_OPTIONAL: ClassVar[int]
    LABEL_REQUIRED: ClassVar[int]
    LABEL_REPEATED: ClassVar[int]
    number: int
    index: int
    type: int
    cpp_type: int
    label: int
    has_presence: bool
    containing_type: Descriptor | None
    message_type: Descriptor | None
    enum_type: EnumDescriptor | None
    containing_oneof: OneofDescriptor | None

class OneofDescriptor(DescriptorBase):
    index: int
    fields: list[FieldDescriptor]

class EnumValueDescriptor(DescriptorBase):
    index: int
    number: int
    type: EnumDescriptor

class EnumDescriptor(DescriptorBase):
    values: list[EnumValueDescriptor]
    values_by_name: dict[str, EnumValueDescriptor]
    values_by_number: dict[int, EnumValueDescriptor]

class Descriptor(DescriptorBase):
    fields: list[FieldDescriptor]
    fields_by_name: dict[str, FieldDescriptor]
    fields_by_number: dict[int, FieldDescriptor]
    nested_types: list[Descriptor]
    enum_types: list[EnumDescriptor]
    oneofs: list[OneofDescriptor]
    oneofs_by_name: dict[str, OneofDescriptor]
    file: FileDescriptor

class MethodDescriptor(DescriptorBase):
    index: int
    containing_service: ServiceDescriptor
    input_type: Descriptor
    output_type: Descriptor
    client_streaming: bool
    server_streaming: bool

class ServiceDescriptor(DescriptorBase):
    index: int
    methods: list[MethodDescriptor]
    methods_by_name: dict[str, MethodDescriptor]

class FileDescriptor:
    name: str
    package: str
    message_types_by_name: dict[str, Descriptor]
    enum_types_by_name: dict[str, EnumDescriptor]
    services_by_name: dict[str, ServiceDescriptor]
    dependencies: list[FileDescriptor]
