# Runs the plain example trainer under mpiexec and checks that it exits 0 and learns: the loss of
# the last epoch must be below 60% of the first epoch's (the spirals dataset is learnable; an
# untrained model's loss stays near ln 3 = 1.10 and broken gradient averaging diverges or stalls).
# Usage: cmake -DMPIEXEC=... -DMPIEXEC_ARGS=... -DTRAINER=... -DTRAINER_ARGS=... -P this file
set(command ${MPIEXEC})
foreach(arg IN LISTS MPIEXEC_ARGS ITEMS ${TRAINER} LISTS TRAINER_ARGS)
  if(NOT arg STREQUAL "")
    list(APPEND command ${arg})
  endif()
endforeach()
list(JOIN command " " shown)
message(STATUS "running: ${shown}")
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "output:\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the trainer exited with ${rc}")
endif()

# Rank 0 prints "epoch <n> loss <x.xxxx> ..." once per epoch; other ranks print nothing.
string(REGEX MATCHALL "epoch +[0-9]+ loss [0-9]+\\.[0-9][0-9][0-9][0-9]" lines "${out}")
list(LENGTH lines epochs)
if(epochs LESS 2)
  message(FATAL_ERROR "expected one 'epoch N loss X' line per epoch from rank 0 only, found ${epochs}")
endif()
set(losses "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE ".* loss ([0-9]+)\\.([0-9]+)$" "\\1\\2" scaled "${line}")  # loss * 10^4
  math(EXPR scaled "${scaled} + 0")  # drops leading zeros
  list(APPEND losses ${scaled})
endforeach()
list(GET losses 0 first)
list(GET losses -1 last)
math(EXPR last_times_10 "${last} * 10")
math(EXPR limit "${first} * 6")
if(NOT last_times_10 LESS limit)
  message(FATAL_ERROR "the loss did not fall: first epoch ${first}e-4, last epoch ${last}e-4 "
                      "(must be below 60% of the first)")
endif()
message(STATUS "loss fell from ${first}e-4 to ${last}e-4 over ${epochs} epochs")
