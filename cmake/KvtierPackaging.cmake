# Debian packages of this build tree with CPack's DEB generator (one
# package per install component of cmake/KvtierInstall.cmake):
#   kvtierd              component daemon
#   libkvtier-client0    component lib (the SONAME libkvtier_client.so.0)
#   libkvtier-client-dev component dev
#   python3-kvtier       component python (Architecture: all)
# `cpack --config <build>/CPackConfig.cmake` (deploy/package.sh) packages
# the binaries the build already has, stripped: no second build. CPack
# rather than debian/ + dpkg-buildpackage because the latter configures and
# builds its own tree, which CI (deploy/test.sh) cannot afford a second time.
set(KVTIER_PACKAGE_MAINTAINER
  "kvtier maintainers <maintainers@users.noreply.a-seed-970dfefb.example>"
  CACHE STRING "Maintainer field of the Debian packages")
set(debian ${PROJECT_SOURCE_DIR}/deploy/debian)
set(gen ${PROJECT_BINARY_DIR}/install)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VENDOR "kvtier")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${KVTIER_PACKAGE_MAINTAINER}")
# Files go under /usr whatever the tree's CMAKE_INSTALL_PREFIX (a DESTDIR
# install, below, takes CPACK_INSTALL_PREFIX as its prefix).
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
# Installed with DESTDIR: absolute destinations (/etc/kvtier,
# /lib/systemd/system) land in the staging root, never in the building
# machine's.
set(CPACK_SET_DESTDIR ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon lib dev python)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# A shlibs file for the packages that hold a shared library (the lib one).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME kvtierd)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "systemd | systemd-standalone-sysusers | systemd-sysusers")
set(CPACK_COMPONENT_DAEMON_DESCRIPTION "KV-cache storage daemon for LLM serving
kvtierd stores finished KV-cache blocks of LLM inference engines by content
hash across GPU memory, host memory and NVMe, and at every decode step tells
the engine which blocks matter and makes them resident in GPU memory. It
serves gRPC over a Unix socket. This package holds the daemon, the kvtierctl
admin CLI, the systemd unit (not enabled on install) and
/etc/kvtier/kvtierd.toml.")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
  ${gen}/debian/conffiles ${gen}/debian/postinst ${gen}/debian/prerm ${gen}/debian/postrm)

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libkvtier-client${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${gen}/debian/lib/triggers)
set(CPACK_COMPONENT_LIB_DESCRIPTION "C++ client library of the kvtier KV-cache daemon
The shared library an inference engine links to store KV-cache blocks in
kvtierd and select the blocks each decode step needs, over gRPC on the
daemon's Unix socket.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libkvtier-client-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "libkvtier-client${PROJECT_VERSION_MAJOR} (= ${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}), libgrpc++-dev, libprotobuf-dev, libabsl-dev, libssl-dev")
set(CPACK_COMPONENT_DEV_DESCRIPTION "C++ client library of the kvtier KV-cache daemon (development files)
Headers, the static library, the CMake package (find_package(kvtier) gives
kvtier::client) and the pkg-config file kvtier-client of the kvtier client
library, with the protocol's .proto files.")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-kvtier)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3, python3-grpcio, python3-protobuf, python3-numpy")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION "Python client of the kvtier KV-cache daemon
The kvtier package: typed calls for every RPC of kvtierd, streamed Select
sessions, zero-copy numpy and torch views of the device arena, the chain
hash and a vLLM-shaped KV connector.")

# The maintainer scripts and conffiles list, with the modes dpkg expects.
file(MAKE_DIRECTORY ${gen}/debian)
foreach(script postinst prerm postrm)
  file(COPY_FILE ${debian}/kvtierd.${script} ${gen}/debian/${script} ONLY_IF_DIFFERENT)
endforeach()
file(COPY_FILE ${debian}/kvtierd.conffiles ${gen}/debian/conffiles ONLY_IF_DIFFERENT)
file(MAKE_DIRECTORY ${gen}/debian/lib)
file(COPY_FILE ${debian}/libkvtier-client.triggers ${gen}/debian/lib/triggers ONLY_IF_DIFFERENT)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${debian}/kvtierd.postinst ${debian}/kvtierd.prerm ${debian}/kvtierd.postrm
  ${debian}/kvtierd.conffiles ${debian}/libkvtier-client.triggers ${debian}/changelog)

# Every package carries the copyright file and the Debian changelog,
# whose first entry must be this version.
file(STRINGS ${debian}/changelog changelog_head LIMIT_COUNT 1)
set(deb_version ${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE})
if(NOT changelog_head MATCHES "^kvtier \\(${deb_version}\\) ")
  message(FATAL_ERROR "deploy/debian/changelog: its first entry must be ${deb_version}")
endif()
find_program(KVTIER_GZIP gzip REQUIRED)
add_custom_command(OUTPUT ${gen}/debian/changelog.Debian.gz
  COMMAND ${KVTIER_GZIP} -9n -c ${debian}/changelog > ${gen}/debian/changelog.Debian.gz
  DEPENDS ${debian}/changelog)
add_custom_target(kvtier_package_docs ALL DEPENDS ${gen}/debian/changelog.Debian.gz)
foreach(component daemon lib dev python)
  string(TOUPPER ${component} upper)
  install(FILES ${debian}/copyright ${gen}/debian/changelog.Debian.gz
    DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${CPACK_DEBIAN_${upper}_PACKAGE_NAME} COMPONENT ${component})
endforeach()

include(CPack)
