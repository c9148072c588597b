// Hugging Face model folders, as transformers' save_pretrained writes them
// and the Hub serves them:
//
//   config.json                    the LlamaConfig (model_from_hf_config)
//   model.safetensors              every weight in one file, or
//   model.safetensors.index.json   {"weight_map": {tensor: shard file}} and
//   model-0000k-of-0000n.safetensors  the shards it names
//
// Weights may be stored in fp32, bf16, fp16 (or fp64); readers convert them
// (tensor_read_f32_block). Only safetensors are read: a folder that holds
// only pytorch_model.bin (a Python pickle, which can run code when loaded) is
// refused with how to convert it.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model_spec.h"
#include "trainer/checkpoint/safetensors.h"

namespace weft::checkpoint {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";

// An opened folder. Tensors point into the mapped files and live as long as
// this object.
struct HfFolder {
  std::string dir;
  ModelSpec model;              // config.json's architecture
  nlohmann::json config;        // config.json as read
  std::vector<SafetensorsFile> files;  // the weight files, in name order
  // Every tensor of every weight file by name.
  std::map<std::string, TensorRef, std::less<>> tensors;
  // The file that holds each tensor, for messages.
  std::map<std::string, std::string, std::less<>> file_of;
};

// config.json's model (model_from_hf_config_json: Llama 3's rope_scaling is
// read; a field whose computation weft's Llama lacks, such as another RoPE
// scaling, biases or another activation, is refused with an InputError
// naming it). Reads no weights.
ModelSpec hf_folder_model(const std::string& dir, nlohmann::json* config = nullptr);

// Opens the folder: its model (as hf_folder_model) and its weight files.
// InputError when it has no weights weft reads; FileFormatError naming the
// file for a malformed index, a shard the index names that is missing or
// outside the folder, a tensor the index places in a shard that lacks it,
// and a tensor stored twice.
HfFolder hf_folder_open(const std::string& dir);

}  // namespace weft::checkpoint
