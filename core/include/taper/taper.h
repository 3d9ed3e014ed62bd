// taper.h: the whole public API. CMake target taper::taper.
#pragma once

#include "taper/autograd.h"
#include "taper/device.h"
#include "taper/dtype.h"
#include "taper/error.h"
#include "taper/op.h"
#include "taper/ops.h"
#include "taper/shape.h"
#include "taper/storage.h"
#include "taper/tensor.h"
