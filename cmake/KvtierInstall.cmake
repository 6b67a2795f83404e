# Install rules: `cmake --install <build>` and the Debian packages of
# cmake/KvtierPackaging.cmake. Components (one package each):
#   daemon  kvtierd, kvtierctl, their man pages, the systemd unit,
#           /etc/kvtier/kvtierd.toml, sysusers.d and tmpfiles.d entries
#   lib     libkvtier_client.so.0
#   dev     headers, libkvtier_client.so and .a, the CMake package
#           (find_package(kvtier): kvtier::client, kvtier::client_static)
#           and the pkg-config file kvtier-client.pc
#   python  the Python package kvtier
# Binaries, libraries and headers go under CMAKE_INSTALL_PREFIX
# (GNUInstallDirs); the files systemd and operators look for go to the
# absolute system paths below whatever the prefix, since only there are
# they found. Every installed file comes from this build tree: nothing is
# rebuilt for packaging.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KVTIER_INSTALL_CONFDIR /etc/kvtier CACHE PATH "Directory of the installed kvtierd.toml")
set(KVTIER_INSTALL_UNITDIR /lib/systemd/system CACHE PATH "systemd system unit directory")
set(KVTIER_INSTALL_SYSUSERSDIR /usr/lib/sysusers.d CACHE PATH "sysusers.d directory")
set(KVTIER_INSTALL_TMPFILESDIR /usr/lib/tmpfiles.d CACHE PATH "tmpfiles.d directory")
set(KVTIER_INSTALL_PYTHONDIR lib/python3/dist-packages CACHE STRING
  "Directory of the Python package, relative to the prefix (Debian's python3 reads /usr/lib/python3/dist-packages)")
set(deploy ${PROJECT_SOURCE_DIR}/deploy)
set(gen ${PROJECT_BINARY_DIR}/install)

# ---- daemon ----------------------------------------------------------------
install(TARGETS kvtierd kvtierctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)

add_custom_command(OUTPUT ${gen}/kvtierd.toml
  COMMAND ${CMAKE_COMMAND} -DIN=${deploy}/kvtierd.toml -DOUT=${gen}/kvtierd.toml
    -P ${PROJECT_SOURCE_DIR}/cmake/installed_config.cmake
  DEPENDS ${deploy}/kvtierd.toml ${PROJECT_SOURCE_DIR}/cmake/installed_config.cmake
  COMMENT "kvtierd.toml for /etc/kvtier" VERBATIM)
set(man_pages)
foreach(program kvtierd kvtierctl)
  if(program STREQUAL "kvtierd")
    set(summary "tiered KV-cache block store for LLM serving")
  else()
    set(summary "administer a running kvtierd")
  endif()
  add_custom_command(OUTPUT ${gen}/man/${program}.1.gz
    # (sanitizer builds: a leak report at exit must not fail the build)
    COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=0
      ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:${program}> -DNAME=${program}
      -DSUMMARY=${summary} -DVERSION=${PROJECT_VERSION} -DOUT=${gen}/man/${program}.1.gz
      -P ${PROJECT_SOURCE_DIR}/cmake/help_to_man.cmake
    DEPENDS ${program} ${PROJECT_SOURCE_DIR}/cmake/help_to_man.cmake
    COMMENT "man page of ${program} from its --help" VERBATIM)
  list(APPEND man_pages ${gen}/man/${program}.1.gz)
endforeach()
add_custom_target(kvtier_install_files ALL DEPENDS ${gen}/kvtierd.toml ${man_pages})

install(FILES ${gen}/kvtierd.toml DESTINATION ${KVTIER_INSTALL_CONFDIR} COMPONENT daemon)
install(FILES ${man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT daemon)
install(FILES ${deploy}/kvtier.sysusers DESTINATION ${KVTIER_INSTALL_SYSUSERSDIR}
  RENAME kvtier.conf COMPONENT daemon)
install(FILES ${deploy}/kvtier.tmpfiles DESTINATION ${KVTIER_INSTALL_TMPFILESDIR}
  RENAME kvtier.conf COMPONENT daemon)
# The unit names the binary where this installation puts it: the prefix is
# known only at install time (cpack installs with prefix /usr).
install(CODE "
  file(READ \"${deploy}/kvtierd.service\" unit)
  string(REPLACE \"ExecStart=/usr/bin/kvtierd \"
    \"ExecStart=\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/kvtierd \" unit \"\${unit}\")
  file(WRITE \"${gen}/unit/kvtierd.service\" \"\${unit}\")
  file(INSTALL DESTINATION \"${KVTIER_INSTALL_UNITDIR}\" TYPE FILE
    PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
    FILES \"${gen}/unit/kvtierd.service\")" COMPONENT daemon)

# ---- C++ client library -----------------------------------------------------
set(kvtier_includedir ${CMAKE_INSTALL_INCLUDEDIR}/kvtier)
install(TARGETS kvtier_client_shared kvtier_client_static EXPORT kvtierTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  INCLUDES DESTINATION ${kvtier_includedir})
# The headers keep their source paths ("client/client.h",
# "kvtier/v1/kvtier.grpc.pb.h") under include/kvtier.
install(FILES ${PROJECT_SOURCE_DIR}/client/client.h ${PROJECT_SOURCE_DIR}/client/select_stream.h
  ${PROJECT_SOURCE_DIR}/client/chain_hash.h ${PROJECT_SOURCE_DIR}/client/anchor.h
  DESTINATION ${kvtier_includedir}/client COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/client/shm/shm_mapping.h
  DESTINATION ${kvtier_includedir}/client/shm COMPONENT dev)
set(proto_gen ${PROJECT_BINARY_DIR}/proto/gen/kvtier/v1)
install(FILES ${proto_gen}/types.pb.h ${proto_gen}/kvtier.pb.h ${proto_gen}/kvtier.grpc.pb.h
  ${proto_gen}/admin.pb.h ${proto_gen}/admin.grpc.pb.h
  DESTINATION ${kvtier_includedir}/kvtier/v1 COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/proto/kvtier/v1/types.proto
  ${PROJECT_SOURCE_DIR}/proto/kvtier/v1/kvtier.proto ${PROJECT_SOURCE_DIR}/proto/kvtier/v1/admin.proto
  DESTINATION ${CMAKE_INSTALL_DATADIR}/kvtier/proto/kvtier/v1 COMPONENT dev)

set(cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kvtier)
install(EXPORT kvtierTargets NAMESPACE kvtier:: DESTINATION ${cmake_dir} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvtierConfig.cmake.in
  ${gen}/kvtierConfig.cmake INSTALL_DESTINATION ${cmake_dir})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${gen}/kvtierConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${gen}/kvtierConfig.cmake ${gen}/kvtierConfigVersion.cmake
  DESTINATION ${cmake_dir} COMPONENT dev)
# pkg-config: the prefix is found from the .pc file's own place, so the
# file is right in any root (a package, a staging directory).
file(RELATIVE_PATH KVTIER_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" KVTIER_PC_TO_PREFIX "${KVTIER_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvtier-client.pc.in ${gen}/kvtier-client.pc @ONLY)
install(FILES ${gen}/kvtier-client.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# ---- Python package --------------------------------------------------------
if(TARGET kvtier_python)
  install(DIRECTORY ${PROJECT_BINARY_DIR}/client/python/kvtier DESTINATION ${KVTIER_INSTALL_PYTHONDIR}
    COMPONENT python PATTERN __pycache__ EXCLUDE)
endif()
