# cmake -DIN=health.proto -DOUT=copy.proto -P rename_health_package.cmake
# Writes a copy of grpc.health.v1's health.proto whose proto package is
# kvtier.health.v1, so that its generated Python module lives inside the
# kvtier package and neither shadows grpcio's own `grpc` package nor clashes
# in protobuf's descriptor pool with grpcio-health-checking's messages. The
# wire format is unchanged; the client calls /grpc.health.v1.Health/Check.
file(READ "${IN}" text)
string(REPLACE "package grpc.health.v1;" "package kvtier.health.v1;" renamed "${text}")
if(renamed STREQUAL text)
  message(FATAL_ERROR "${IN}: no 'package grpc.health.v1;' line to rename")
endif()
file(WRITE "${OUT}" "${renamed}")
