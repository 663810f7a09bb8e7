#include "tiler/model/probe.hpp"

#include "tiler/core/error.hpp"

namespace tiler {

Activation parseActivation(const std::string& name) {
  if (name == "none") return Activation::kNone;
  if (name == "softmax") return Activation::kSoftmax;
  if (name == "sigmoid") return Activation::kSigmoid;
  TILER_THROW(ConfigError, "--activation must be none, softmax or sigmoid; got '" << name << "'");
}

float labelThreshold(Activation activation) {
  return activation == Activation::kSigmoid ? 0.5f : 0.0f;
}

Tta parseTta(const std::string& name) {
  if (name == "none") return Tta::kNone;
  if (name == "flip") return Tta::kFlip;
  if (name == "d4") return Tta::kD4;
  TILER_THROW(ConfigError, "--tta must be none, flip or d4; got '" << name << "'");
}

const char* ttaName(Tta tta) {
  return tta == Tta::kFlip ? "flip" : tta == Tta::kD4 ? "d4" : "none";
}

const char* precisionName(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

}  // namespace tiler
