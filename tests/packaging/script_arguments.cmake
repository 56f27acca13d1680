# Included by the packaging tests' scripts, run as `cmake [-D...] -P <script> -- <arguments>`.

# The arguments after "--" into `out`, one list element each: a -DLIST=a;b keeps its semicolons
# escaped, so that it stays one argument when the list is expanded into a command.
function(dtrain_script_arguments out)
  set(args)
  set(after_separator OFF)
  math(EXPR last "${CMAKE_ARGC} - 1")
  foreach(i RANGE ${last})
    if(after_separator)
      string(REPLACE ";" "\\;" arg "${CMAKE_ARGV${i}}")
      list(APPEND args "${arg}")
    elseif(CMAKE_ARGV${i} STREQUAL "--")
      set(after_separator ON)
    endif()
  endforeach()
  set(${out} "${args}" PARENT_SCOPE)
endfunction()
