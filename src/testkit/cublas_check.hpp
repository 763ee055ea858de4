// Turns a failed cuBLAS or cuBLASLt call into hmoe::Error naming the status, the call and where.
#pragma once

#include <cublas_api.h>

#include <string>

#include "hmoe/hmoe.hpp"

#define HMOE_CUBLAS_CHECK(call)                                                                       \
  do {                                                                                                \
    const cublasStatus_t hmoe_cublas_status_ = (call);                                                \
    if (hmoe_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                 \
      throw ::hmoe::Error(std::string("hmoe: cuBLAS error ") + cublasGetStatusName(hmoe_cublas_status_) + \
                          " in " #call " at " __FILE__ ":" + std::to_string(__LINE__));               \
  } while (0)
