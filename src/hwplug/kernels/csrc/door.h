/*
 * What the C++ doors of the native ops share (csrc/op_door.cpp, csrc/attention_door.cpp):
 * the switches they read at each call and the tensors they take as they are.
 */
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdlib>

namespace hwplug_door {

/* Whether the variable `name` is set to 0 (blanks around it allowed), as Python reads it. */
inline bool switched_off(const char *name) {
    const char *value = std::getenv(name);
    if (value == nullptr) return false;
    while (*value == ' ' || *value == '\t' || *value == '\n') value++;
    if (*value != '0') return false;
    value++;
    while (*value == ' ' || *value == '\t' || *value == '\n') value++;
    return *value == '\0';
}

/* Whether HWPLUG_NATIVE_KERNELS=0 or HWPLUG_NATIVE_DOOR=0 sends every call to Python. */
inline bool closed() {
    return switched_off("HWPLUG_NATIVE_KERNELS") || switched_off("HWPLUG_NATIVE_DOOR");
}

/* A dense CPU tensor of `dims` dimensions whose elements are read as they lie. */
inline bool plain(const at::Tensor &t, int64_t dims) {
    return t.defined() && t.dim() == dims && t.layout() == c10::kStrided && t.device().is_cpu() &&
           !t.is_neg() && !t.is_conj();
}

}  // namespace hwplug_door
