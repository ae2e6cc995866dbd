/*
 * The C++ door of hwplug::native_linear: a compiled step calls the native kernel with no
 * Python in between, for calls whose layout Python has already checked.
 *
 * Built and loaded by hwplug.kernels.op_door (with torch's headers and libraries), it
 * registers a CPU kernel for the op that looks the call's layout up in a table of
 * approved layouts: dtypes, sizes and strides of x, the weight and the bias. The table
 * is written only by the validated Python door (hwplug::native_linear_checked, which
 * hwplug.kernels.linear defines): after it has checked a call and chosen its kernel, it
 * approves that call's layout with the kernel. So every layout the native kernel is
 * reached with from here has passed Python's checks; a call whose layout is not in the
 * table (its first call, any misuse), a call while HWPLUG_NATIVE_KERNELS=0 or
 * HWPLUG_NATIVE_DOOR=0 is set, and a call the kernel refuses go to the validated door,
 * which checks it, raises its named errors, computes it and approves it if it may.
 * The kernels keep their own bounds checks (status 3).
 *
 * The kernels are the C library's (hwplug_cpu-*.so): their addresses are bound once,
 * from Python, before anything is approved.
 */
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "door.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace {

/* hwplug_linear: the vector path (weight kind 0 float32, 1 bfloat16, 2 float16). */
using VectorKernel = int (*)(const void *x, int64_t rows, int64_t k, int64_t ldx,
                             const void *w, int kind, int64_t n, int64_t ldw,
                             const void *bias, void *y, int64_t ldy, int threads);
/* hwplug_linear_row_bf16, _amx, _dpbf16: bfloat16 pairs, y float32 or (y_bf16) bfloat16. */
using PairsKernel = int (*)(const void *x, int64_t rows, int64_t k, int64_t ldx,
                            const void *w, int64_t n, int64_t ldw, const void *bias, void *y,
                            int64_t ldy, int y_bf16, int threads);

enum Path : int { kVector = 0, kRow = 1, kAmx = 2, kDpbf16 = 3, kPaths = 4 };

/* A call's layout: x's and the weight's dtypes, sizes and strides; the bias's dtype
 * (-1: none), size and stride. */
constexpr int kFields = 13;
struct Layout {
    std::array<int64_t, kFields> v;
    bool operator==(const Layout &o) const { return v == o.v; }
};
struct LayoutHash {
    size_t operator()(const Layout &layout) const {
        uint64_t h = 1469598103934665603ull; /* FNV-1a over the fields */
        for (int64_t f : layout.v) {
            h = (h ^ static_cast<uint64_t>(f)) * 1099511628211ull;
        }
        return static_cast<size_t>(h);
    }
};
/* What an approved layout runs: the kernel's path, the weight's kind for the vector
 * path, and the result's dtype. */
struct Approved {
    int path;
    int weight_kind;
    c10::ScalarType out;
};

constexpr size_t kMaxApproved = 1 << 16; /* layouts kept (each step size adds ~a model's) */
std::mutex table_lock;
std::unordered_map<Layout, Approved, LayoutHash> approved;
std::array<void *, kPaths> kernels{};

Layout layout_of(const at::Tensor &x, const at::Tensor &w, int64_t bias_dtype,
                 int64_t bias_size, int64_t bias_stride) {
    return Layout{{static_cast<int64_t>(x.scalar_type()), static_cast<int64_t>(w.scalar_type()),
                   x.size(0), x.size(1), x.stride(0), x.stride(1), w.size(0), w.size(1),
                   w.stride(0), w.stride(1), bias_dtype, bias_size, bias_stride}};
}

at::Tensor checked(const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &bias) {
    static auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("hwplug::native_linear_checked", "")
            .typed<at::Tensor(const at::Tensor &, const at::Tensor &, const std::optional<at::Tensor> &)>();
    return op.call(x, w, bias);
}

at::Tensor native_linear(const at::Tensor &x, const at::Tensor &w,
                         const std::optional<at::Tensor> &bias) {
    if (!hwplug_door::plain(x, 2) || !hwplug_door::plain(w, 2)) return checked(x, w, bias);
    int64_t bias_dtype = -1, bias_size = 0, bias_stride = 0;
    const void *bias_data = nullptr;
    if (bias.has_value()) {
        const at::Tensor &b = *bias;
        if (!hwplug_door::plain(b, 1)) return checked(x, w, bias);
        bias_dtype = static_cast<int64_t>(b.scalar_type());
        bias_size = b.size(0);
        bias_stride = b.stride(0);
        bias_data = b.data_ptr();
    }
    const Layout layout = layout_of(x, w, bias_dtype, bias_size, bias_stride);
    Approved run{};
    bool found = false;
    {
        std::lock_guard<std::mutex> hold(table_lock);
        auto it = approved.find(layout);
        if (it != approved.end()) {
            run = it->second;
            found = true;
        }
    }
    if (!found || hwplug_door::closed()) {
        return checked(x, w, bias);
    }
    void *kernel = kernels[run.path];
    if (kernel == nullptr) return checked(x, w, bias);
    const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
    const int threads = at::get_num_threads();
    int status;
    at::Tensor y;
    if (run.path == kVector) {
        /* the vector path multiplies float32 rows into float32; a 16-bit x is widened
         * first and the result rounded to x's dtype after, as the Python door does */
        const at::Tensor rows_f32 = x.scalar_type() == c10::ScalarType::Float ? x : x.to(at::kFloat);
        y = at::empty({rows, n}, x.options().dtype(at::kFloat));
        status = reinterpret_cast<VectorKernel>(kernel)(
            rows_f32.data_ptr(), rows, k, rows_f32.stride(0), w.data_ptr(), run.weight_kind, n,
            w.stride(0), bias_data, y.data_ptr(), n, threads);
        if (status == 0 && run.out != c10::ScalarType::Float) y = y.to(run.out);
    } else {
        y = at::empty({rows, n}, x.options().dtype(run.out));
        status = reinterpret_cast<PairsKernel>(kernel)(
            x.data_ptr(), rows, k, x.stride(0), w.data_ptr(), n, w.stride(0), bias_data,
            y.data_ptr(), n, run.out == c10::ScalarType::BFloat16 ? 1 : 0, threads);
    }
    /* a status is the validated door's to explain (it raises the named error) */
    return status == 0 ? y : checked(x, w, bias);
}

}  // namespace

extern "C" {

/* The version of this interface the Python side speaks. */
int hwplug_op_door_version(void) { return 3; }

/* The C library's kernels, by path; 0 bound, 1 already bound to others. */
int hwplug_op_door_bind(void *vector, void *row, void *amx, void *dpbf16) {
    std::lock_guard<std::mutex> hold(table_lock);
    const std::array<void *, kPaths> given{vector, row, amx, dpbf16};
    for (int p = 0; p < kPaths; p++) {
        if (kernels[p] != nullptr && kernels[p] != given[p]) return 1;
    }
    kernels = given;
    return 0;
}

/* Approve a layout Python has checked, with the path that runs it. 0 approved; 1 the
 * table is full; 2 a path or dtype this door does not know. */
int hwplug_op_door_approve(const int64_t *fields, int path, int weight_kind, int out_dtype) {
    if (path < 0 || path >= kPaths) return 2;
    const auto out = static_cast<c10::ScalarType>(out_dtype);
    if (out != c10::ScalarType::Float && out != c10::ScalarType::BFloat16 &&
        out != c10::ScalarType::Half) {
        return 2;
    }
    Layout layout{};
    std::memcpy(layout.v.data(), fields, sizeof(int64_t) * kFields);
    std::lock_guard<std::mutex> hold(table_lock);
    if (approved.size() >= kMaxApproved && approved.find(layout) == approved.end()) return 1;
    approved[layout] = Approved{path, weight_kind, out};
    return 0;
}

/* Layouts approved so far. */
int64_t hwplug_op_door_approved(void) {
    std::lock_guard<std::mutex> hold(table_lock);
    return static_cast<int64_t>(approved.size());
}

}  // extern "C"

TORCH_LIBRARY_IMPL(hwplug, CPU, m) { m.impl("native_linear", &native_linear); }
