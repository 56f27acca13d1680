#pragma once
// The consumer's other two files (consumer.cpp).
bool consumer_allreduce_sum_ok();  // consumer_ops.cpp
bool consumer_allgather_ok();      // consumer_ops.cpp
bool consumer_sampler_ok();        // consumer_training.cpp
