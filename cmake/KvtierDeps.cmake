# Imported targets for the Debian packages listed in deploy/install-deps.sh.
# pkg-config is used where Debian ships no usable CMake package config.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(spdlog REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(CLI11 REQUIRED)

pkg_check_modules(KV_GRPCPP REQUIRED IMPORTED_TARGET grpc++)
pkg_check_modules(KV_PROTOBUF REQUIRED IMPORTED_TARGET protobuf)
pkg_check_modules(KV_ROCKSDB REQUIRED IMPORTED_TARGET rocksdb)
pkg_check_modules(KV_URING REQUIRED IMPORTED_TARGET liburing)
pkg_check_modules(KV_XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(KV_SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
find_package(OpenSSL REQUIRED)

find_program(KVTIER_PROTOC protoc REQUIRED)
find_program(KVTIER_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
