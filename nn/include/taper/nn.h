// nn.h: the whole nn layer (modules, losses, optimizers, safetensors) and the core API
// (taper.h): `#include <taper/nn.h>`.
#pragma once

#include "taper/nn/attention.h"
#include "taper/nn/functional.h"
#include "taper/nn/layers.h"
#include "taper/nn/loss.h"
#include "taper/nn/module.h"
#include "taper/nn/optim.h"
#include "taper/nn/options.h"
#include "taper/nn/safetensors.h"
#include "taper/taper.h"
