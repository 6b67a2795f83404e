# cmake -DPROGRAM=<binary> -DNAME=<name> -DSUMMARY=<text> -DVERSION=<v>
#       -DOUT=<page.1.gz> -P help_to_man.cmake
# Writes a section-1 man page from the program's --help (CLI11), and for
# each entry of its "SUBCOMMANDS:" list that subcommand's --help, then
# compresses it with gzip -9n (no name or time stamp: reproducible).
function(help_of out)
  execute_process(COMMAND "${PROGRAM}" ${ARGN} --help OUTPUT_VARIABLE text
    RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "help_to_man: ${PROGRAM} ${ARGN} --help exited with ${rc}")
  endif()
  # "Usage: NAME", not the path of the binary in the build tree.
  string(REPLACE "${PROGRAM}" "${NAME}" text "${text}")
  # roff: a backslash is \e; a line starting with . or ' would be a request.
  string(REPLACE "\\" "\\e" text "${text}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

help_of(main)
string(TOUPPER "${NAME}" upper)
set(page ".TH ${upper} 1 \"\" \"kvtier ${VERSION}\" \"kvtier manual\"
.SH NAME
${NAME} \\- ${SUMMARY}
.SH DESCRIPTION
The options below are the program's own --help.
.PP
.nf
${main}.fi
")
# Subcommands: the indented names under "SUBCOMMANDS:" up to a blank line.
string(REGEX MATCH "(SUBCOMMANDS|Subcommands):\n(  [^\n]*\n)+" block "${main}")
string(REGEX MATCHALL "\n  [a-z][a-z-]*" subs "${block}")
foreach(sub ${subs})
  string(STRIP "${sub}" sub)
  help_of(sub_help ${sub})
  string(APPEND page ".SH COMMAND ${sub}\n.nf\n${sub_help}.fi\n")
endforeach()
string(APPEND page ".SH SEE ALSO
kvtierd(1), kvtierctl(1); README.md and docs/ of the kvtier sources.
")
get_filename_component(raw "${OUT}" NAME_WLE)
get_filename_component(dir "${OUT}" DIRECTORY)
file(WRITE "${dir}/${raw}" "${page}")
find_program(GZIP gzip REQUIRED)
execute_process(COMMAND "${GZIP}" -9nf "${dir}/${raw}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "help_to_man: gzip failed")
endif()
