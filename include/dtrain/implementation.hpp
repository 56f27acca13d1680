#pragma once
// The definitions behind the public headers' DTRAIN_API declarations (Note [Build modes] in
// core/build_mode.hpp). Include it in exactly one file of a program built with
// DTRAIN_COMPILED_LIB defined everywhere, the way the CMake target dtrain::dtrain does with
// src/dtrain.cpp; with a copy of include/ alone, a one-line file of your own does the same.
#ifndef DTRAIN_COMPILED_LIB
#error "dtrain/implementation.hpp is for the compiled mode: define DTRAIN_COMPILED_LIB for every \
file of the program, or leave it out and use dtrain header-only (no implementation file needed)"
#endif
#include "dtrain/core/config_impl.hpp"
#include "dtrain/core/logging_impl.hpp"
#include "dtrain/core/version_impl.hpp"
#include "dtrain/data/file_sharder_impl.hpp"
#include "dtrain/profile/optimizer_steps_impl.hpp"
#include "dtrain/profile/profiler_impl.hpp"
#include "dtrain/runtime/detail/collectives_impl.hpp"
#include "dtrain/runtime/detail/grouped_collectives_impl.hpp"
#include "dtrain/runtime/detail/handle_impl.hpp"
#include "dtrain/runtime/detail/op_checks_impl.hpp"
#include "dtrain/runtime/detail/process_set_impl.hpp"
#include "dtrain/runtime/detail/session_impl.hpp"
#include "dtrain/runtime/detail/submission_impl.hpp"
#include "dtrain/train/broadcast_parameters_impl.hpp"
#include "dtrain/train/checkpoint_impl.hpp"
#include "dtrain/train/distributed_optimizer_impl.hpp"
#include "dtrain/train/elastic_impl.hpp"
#include "dtrain/train/gradient_hook_impl.hpp"
#include "dtrain/train/objects_impl.hpp"
#include "dtrain/train/powersgd_impl.hpp"
