# cmake -DIN=deploy/kvtierd.toml -DOUT=<file> -P installed_config.cmake
# Writes the configuration the kvtierd package installs as
# /etc/kvtier/kvtierd.toml: the embedded defaults (IN, every key shown)
# with the data directory and socket the systemd unit provides
# (StateDirectory=/var/lib/kvtier, RuntimeDirectory=/run/kvtier). Fails when
# a line it replaces is not found exactly once, so the two files cannot
# drift apart unseen.
file(READ "${IN}" text)
function(replace_once from to)
  string(FIND "${text}" "${from}" first)
  string(FIND "${text}" "${from}" last REVERSE)
  if(first EQUAL -1 OR NOT first EQUAL last)
    message(FATAL_ERROR "installed_config: '${from}' must occur once in ${IN}")
  endif()
  string(REPLACE "${from}" "${to}" replaced "${text}")
  set(text "${replaced}" PARENT_SCOPE)
endfunction()
replace_once("# kvtierd configuration. This file is also the daemon's embedded default:
# every key below shows its default value."
"# kvtierd configuration, installed by the kvtierd package: the daemon's
# embedded defaults (kvtierd --print-default-config) with server.data_dir
# and server.socket_path set to the directories kvtierd.service provides.
# dpkg keeps your changes on upgrade. Every other key
# shows its default.")
replace_once("data_dir = \"./var/kvtier\"" "data_dir = \"/var/lib/kvtier\"")
replace_once("\nsocket_path = \"\"\n" "\nsocket_path = \"/run/kvtier/kvtierd.sock\"\n")
file(WRITE "${OUT}.tmp" "${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
