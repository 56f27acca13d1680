#pragma once
// Note [Build modes]
// One set of headers, two ways to build a program with them.
//
// Header-only (dtrain::header_only, a copy of include/, any file compiled without
// DTRAIN_COMPILED_LIB; CMake's dtrain::dtrain is the compiled mode): every translation unit that
// includes a public header also compiles the engine behind it, as inline definitions the linker
// folds into one. Nothing to build or link but MPI and {fmt}; each such file pays for the engine.
//
// Compiled (DTRAIN_COMPILED_LIB, set by the CMake target dtrain::dtrain): the public headers only
// declare the functions that reach the engine (lifecycle, submission, the profiler, checkpoint
// files); src/dtrain.cpp defines them once, in the library dtrain::dtrain builds. A user's file
// that includes <dtrain/dtrain.hpp> then takes about 2.5 times the compile time of the same
// program written with MPI and {fmt} directly, against about 40 times header-only (measured in
// docs/performance.md, "Compile time").
//
// The public headers mark those functions DTRAIN_API (`inline` when header-only, nothing when
// compiled) and, when header-only, include their definitions (the *_impl.hpp headers) at their
// end. Everything else internal (engine, coordinator, backends, autotuner) is ordinary inline code
// in headers only the *_impl.hpp headers include. A program uses one mode in all its files.
#if defined(DTRAIN_COMPILED_LIB) && defined(DTRAIN_HEADER_ONLY)
#error "dtrain: DTRAIN_COMPILED_LIB and DTRAIN_HEADER_ONLY are both defined: link dtrain::dtrain \
(compiled) or dtrain::header_only, not both, and define neither macro yourself"
#endif

#if defined(DTRAIN_COMPILED_LIB)
#define DTRAIN_API
#else
#ifndef DTRAIN_HEADER_ONLY
#define DTRAIN_HEADER_ONLY 1
#endif
#define DTRAIN_API inline
#endif
