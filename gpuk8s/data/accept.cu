// gpuk8s accept: the performance half of a GPU node's acceptance (the health half is
// nvidia-smi's, read by gpuk8s/accept/node.py). Built on the node with the CUDA toolkit gpuk8s
// installs, for the node's own GPUs, and linked with cuBLAS; NCCL (libnccl2 from NVIDIA's
// repository) is loaded at run time so that a node without it still reports everything else.
//
// Every figure is the median of several timed iterations after warm-up. Lines printed (parsed by
// gpuk8s.accept.bench.parse, which trusts none of them to be well formed):
//   ACCEPT-BENCH 1 quick=<0|1>
//   CUDA devices=<n> runtime=<v> driver=<v>
//   DEVICE <i> bus=<pci bus id> cc=<major.minor> sms=<n> mem_mib=<n>
//   MATMUL <i> <bf16|fp16|tf32|fp32> <TFLOPS>          dense GEMM, M=N=K
//   MEMBW <i> <GB/s>                                   device-to-device copy, bytes read + written
//   H2D <i> <GB/s> / D2H <i> <GB/s>                    pinned host memory, cudaMemcpyAsync
//   P2P <src> <dst> <GB/s> <peer|staged>               cudaMemcpyPeerAsync, one direction
//   NCCL version=<v> / NCCL allreduce bytes=<n> busbw=<GB/s> algbw=<GB/s>
//   NCCL unavailable <why>
//   ERROR <what>                                       a step that could not run
// GB = 1e9 bytes. Bus bandwidth of an all-reduce on n GPUs = algbw * 2(n-1)/n, the convention
// of NVIDIA's nccl-tests (doc/PERFORMANCE.md there), so figures compare with published ones.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <dlfcn.h>
#include <string>
#include <vector>

#define CK(call)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      printf("ERROR %s: %s\n", #call, cudaGetErrorString(e_));                           \
      return false;                                                                      \
    }                                                                                    \
  } while (0)

static bool quick = false;

static double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

// Median milliseconds of `runs` calls of `copy` on stream `st`, each between two events; the
// first three warm up and are left out.
template <typename F> static double median_ms(cudaStream_t st, int runs, F copy) {
  cudaEvent_t s, e;
  cudaEventCreate(&s);
  cudaEventCreate(&e);
  std::vector<double> ms;
  for (int i = 0; i < runs; i++) {
    cudaEventRecord(s, st);
    copy();
    cudaEventRecord(e, st);
    cudaEventSynchronize(e);
    float t = 0;
    cudaEventElapsedTime(&t, s, e);
    if (i >= 3) ms.push_back(t);
  }
  cudaEventDestroy(s);
  cudaEventDestroy(e);
  return median(ms);
}

// Fill with values in [-1, 1) from a hash of the index: random-looking data draws the power a
// real workload draws (a matrix of zeros runs faster than any real one).
template <typename T> __global__ void fill(T *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed;
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13;
    p[i] = (T)((float)(x & 0xffff) / 32768.0f - 1.0f);
  }
}

struct Gemm {
  const char *name;
  cudaDataType_t type;
  cublasComputeType_t compute;
  size_t elem;
};

static const Gemm GEMMS[] = {
    {"bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2},
    {"fp16", CUDA_R_16F, CUBLAS_COMPUTE_32F, 2},
    {"tf32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4},
    {"fp32", CUDA_R_32F, CUBLAS_COMPUTE_32F, 4},
};

// The products a GPU is judged on: BF16, FP16 and TF32 from Ampere (8.x) on; FP16 and FP32 on
// Volta and Turing (7.x); FP32 before.
static bool has(const cudaDeviceProp &p, const Gemm &g) {
  std::string n = g.name;
  if (p.major >= 8) return n != "fp32";
  if (p.major == 7) return n == "fp16" || n == "fp32";
  return n == "fp32";
}

struct Slot {  // one GPU's share of one product
  int dev;
  cublasHandle_t h = nullptr;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cudaEvent_t s = nullptr, e = nullptr;
  int batch = 10;
  std::vector<double> tflops;
};

static cublasStatus_t launch(Slot &x, const Gemm &g, int n) {
  float alpha = 1.0f, beta = 0.0f;
  return cublasGemmEx(x.h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, x.a, g.type, n, x.b, g.type,
                      n, &beta, x.c, g.type, n, g.compute, CUBLAS_GEMM_DEFAULT);
}

// One timed round: `batch` products on every GPU at once, events around each GPU's batch.
static bool round_all(std::vector<Slot> &xs, const Gemm &g, int n, bool keep) {
  for (Slot &x : xs) {
    cudaSetDevice(x.dev);
    cudaEventRecord(x.s);
    for (int i = 0; i < x.batch; i++)
      if (launch(x, g, n) != CUBLAS_STATUS_SUCCESS) return false;
    cudaEventRecord(x.e);
  }
  for (Slot &x : xs) {
    cudaSetDevice(x.dev);
    cudaEventSynchronize(x.e);
    float ms = 0;
    cudaEventElapsedTime(&ms, x.s, x.e);
    double per = ms / x.batch;
    if (keep) x.tflops.push_back(2.0 * n * (double)n * n / (per * 1e-3) / 1e12);
    else x.batch = std::max(1, (int)((quick ? 100.0 : 500.0) / per));  // a window's launches
  }
  return true;
}

// Dense products on all GPUs at once, as a training job loads a node (shared power and cooling):
// warm-up until the clocks settle where power and temperature hold them under sustained load
// (an H200 at its 700 W limit drops from 1980 MHz to about 1500 within a second), then ten
// timed windows of 0.1 s (--quick) or 0.5 s per GPU; a GPU's figure is its median window.
static bool matmul(int ndev, const std::vector<cudaDeviceProp> &props) {
  const int n = 8192;  // 1.1e12 operations a product: far past launch overhead on any GPU
  bool ok = true;
  for (const Gemm &g : GEMMS) {
    std::vector<Slot> xs;
    size_t count = (size_t)n * n;
    for (int d = 0; d < ndev; d++) {
      if (!has(props[d], g)) continue;
      Slot x;
      x.dev = d;
      cudaSetDevice(d);
      if (cublasCreate(&x.h) != CUBLAS_STATUS_SUCCESS || cudaMalloc(&x.a, count * g.elem) ||
          cudaMalloc(&x.b, count * g.elem) || cudaMalloc(&x.c, count * g.elem)) {
        printf("ERROR the %s product could not be set up on GPU %d\n", g.name, d);
        ok = false;
        if (x.h) cublasDestroy(x.h);
        cudaFree(x.a); cudaFree(x.b); cudaFree(x.c);
        continue;
      }
      if (g.type == CUDA_R_16BF) {
        fill<<<1024, 256>>>((__nv_bfloat16 *)x.a, count, 1u);
        fill<<<1024, 256>>>((__nv_bfloat16 *)x.b, count, 2u);
      } else if (g.type == CUDA_R_16F) {
        fill<<<1024, 256>>>((__half *)x.a, count, 1u);
        fill<<<1024, 256>>>((__half *)x.b, count, 2u);
      } else {
        fill<<<1024, 256>>>((float *)x.a, count, 1u);
        fill<<<1024, 256>>>((float *)x.b, count, 2u);
      }
      cudaEventCreate(&x.s);
      cudaEventCreate(&x.e);
      xs.push_back(x);
    }
    if (xs.empty()) continue;
    bool good = true;
    auto t0 = std::chrono::steady_clock::now();
    double warm = quick ? 1.5 : 3.0;
    while (good && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < warm)
      good = round_all(xs, g, n, false);
    for (int w = 0; good && w < 10; w++) good = round_all(xs, g, n, true);
    if (!good) {
      printf("ERROR cuBLAS refused the %s product\n", g.name);
      ok = false;
    }
    for (Slot &x : xs) {
      if (good) printf("MATMUL %d %s %.1f\n", x.dev, g.name, median(x.tflops));
      cudaSetDevice(x.dev);
      cudaEventDestroy(x.s); cudaEventDestroy(x.e);
      cudaFree(x.a); cudaFree(x.b); cudaFree(x.c);
      cublasDestroy(x.h);
    }
  }
  return ok;
}

// Device memory bandwidth: cudaMemcpyAsync within the device (the driver's own copy, which
// reads and writes every byte once: 2x the size moved; on an H200 it gave 4.2-4.27 TB/s where a
// plain float4 copy kernel gave 3.8-3.97).
static bool membw(int dev) {
  CK(cudaSetDevice(dev));
  size_t bytes = (size_t)(quick ? 1 : 4) << 30;  // far past any L2
  void *in, *out;
  CK(cudaMalloc(&in, bytes));
  CK(cudaMalloc(&out, bytes));
  CK(cudaMemset(in, 1, bytes));
  double ms = median_ms(0, quick ? 13 : 33, [&]() {
    cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice);
  });
  CK(cudaGetLastError());
  printf("MEMBW %d %.1f\n", dev, 2.0 * bytes / (ms * 1e-3) / 1e9);
  cudaFree(in); cudaFree(out);
  return true;
}

static bool host_copies(int dev) {
  CK(cudaSetDevice(dev));
  size_t bytes = (size_t)(quick ? 256 : 1024) << 20;
  void *host, *gpu;
  CK(cudaMallocHost(&host, bytes));
  CK(cudaMalloc(&gpu, bytes));
  memset(host, 1, bytes);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int dir = 0; dir < 2; dir++) {
    double ms = median_ms(st, quick ? 8 : 23, [&]() {
      if (dir == 0) cudaMemcpyAsync(gpu, host, bytes, cudaMemcpyHostToDevice, st);
      else cudaMemcpyAsync(host, gpu, bytes, cudaMemcpyDeviceToHost, st);
    });
    CK(cudaGetLastError());
    printf("%s %d %.1f\n", dir == 0 ? "H2D" : "D2H", dev, bytes / (ms * 1e-3) / 1e9);
  }
  cudaStreamDestroy(st);
  cudaFreeHost(host); cudaFree(gpu);
  return true;
}

static bool peer(int src, int dst) {
  size_t bytes = (size_t)(quick ? 256 : 1024) << 20;
  int can = 0;
  CK(cudaDeviceCanAccessPeer(&can, dst, src));
  void *a, *b;
  CK(cudaSetDevice(src));
  CK(cudaMalloc(&a, bytes));
  CK(cudaMemset(a, 1, bytes));
  CK(cudaSetDevice(dst));
  if (can) {
    cudaError_t e = cudaDeviceEnablePeerAccess(src, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) can = 0;
    cudaGetLastError();
  }
  CK(cudaMalloc(&b, bytes));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  double ms = median_ms(st, quick ? 6 : 13, [&]() {
    cudaMemcpyPeerAsync(b, dst, a, src, bytes, st);
  });
  CK(cudaGetLastError());
  printf("P2P %d %d %.1f %s\n", src, dst, bytes / (ms * 1e-3) / 1e9, can ? "peer" : "staged");
  cudaStreamDestroy(st);
  cudaFree(b);
  if (can) cudaDeviceDisablePeerAccess(src);
  CK(cudaSetDevice(src));
  cudaFree(a);
  return true;
}

// The few NCCL entry points used, declared here so that the program builds without nccl.h and
// runs without libnccl (their ABI is fixed: nccl.h.in, enums ncclFloat = 7, ncclSum = 0).
typedef struct ncclComm *ncclComm_t;
typedef int (*InitAll)(ncclComm_t *, int, const int *);
typedef int (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
typedef int (*Group)();
typedef int (*Destroy)(ncclComm_t);
typedef const char *(*ErrStr)(int);
typedef int (*Version)(int *);

static bool nccl(int n) {
  void *lib = dlopen("libnccl.so.2", RTLD_NOW);
  if (!lib) {
    printf("NCCL unavailable %s\n", dlerror());
    return true;  // the judge decides what a missing NCCL means
  }
  InitAll init = (InitAll)dlsym(lib, "ncclCommInitAll");
  AllReduce allreduce = (AllReduce)dlsym(lib, "ncclAllReduce");
  Group start = (Group)dlsym(lib, "ncclGroupStart"), end = (Group)dlsym(lib, "ncclGroupEnd");
  Destroy destroy = (Destroy)dlsym(lib, "ncclCommDestroy");
  ErrStr err = (ErrStr)dlsym(lib, "ncclGetErrorString");
  Version version = (Version)dlsym(lib, "ncclGetVersion");
  if (!init || !allreduce || !start || !end || !destroy || !err || !version) {
    printf("NCCL unavailable libnccl.so.2 lacks an entry point\n");
    return true;
  }
  int v = 0;
  version(&v);
  printf("NCCL version=%d\n", v);
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devs(n);
  for (int i = 0; i < n; i++) devs[i] = i;
  int r = init(comms.data(), n, devs.data());
  if (r != 0) {
    printf("ERROR ncclCommInitAll: %s\n", err(r));
    return false;
  }
  // 8 GiB, or a quarter of the smallest GPU's memory: bus bandwidth reaches its plateau only
  // with large messages (NVIDIA's NCCL lead, nccl-tests#212: "256M is too small to reach
  // peak"; on 2x H200, 1 GiB gave 322-327 GB/s where 8 GiB gave 346), in both modes
  size_t bytes = (size_t)8 << 30;
  for (int i = 0; i < n; i++) {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, i);
    bytes = std::min(bytes, p.totalGlobalMem / 4 / 256 * 256);
  }
  size_t count = bytes / sizeof(float);
  std::vector<float *> buf(n);
  std::vector<cudaStream_t> st(n);
  for (int i = 0; i < n; i++) {
    CK(cudaSetDevice(i));
    CK(cudaMalloc(&buf[i], bytes));
    CK(cudaMemset(buf[i], 0, bytes));
    CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
  }
  auto once = [&]() {
    start();
    for (int i = 0; i < n; i++) allreduce(buf[i], buf[i], count, 7, 0, comms[i], st[i]);
    return end();
  };
  auto sync = [&]() {
    for (int i = 0; i < n; i++) { cudaSetDevice(i); cudaStreamSynchronize(st[i]); }
  };
  for (int i = 0; i < 3; i++) once();
  sync();
  std::vector<double> ms;
  for (int i = 0; i < (quick ? 5 : 20); i++) {
    auto t0 = std::chrono::steady_clock::now();
    if ((r = once()) != 0) {
      printf("ERROR ncclAllReduce: %s\n", err(r));
      return false;
    }
    sync();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
  }
  double alg = bytes / (median(ms) * 1e-3) / 1e9;
  printf("NCCL allreduce bytes=%zu busbw=%.1f algbw=%.1f\n", bytes, alg * 2.0 * (n - 1) / n, alg);
  for (int i = 0; i < n; i++) {
    cudaSetDevice(i);
    cudaFree(buf[i]);
    cudaStreamDestroy(st[i]);
    destroy(comms[i]);
  }
  return true;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--quick")) quick = true;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  printf("ACCEPT-BENCH 1 quick=%d\n", quick ? 1 : 0);
  int n = 0, rt = 0, drv = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  printf("CUDA devices=%d runtime=%d driver=%d\n", e == cudaSuccess ? n : 0, rt, drv);
  if (e != cudaSuccess) {
    printf("ERROR cudaGetDeviceCount: %s\n", cudaGetErrorString(e));
    return 2;
  }
  std::vector<cudaDeviceProp> props(n);
  for (int i = 0; i < n; i++) {
    char bus[32] = "";
    cudaGetDeviceProperties(&props[i], i);
    cudaDeviceGetPCIBusId(bus, sizeof bus, i);
    printf("DEVICE %d bus=%s cc=%d.%d sms=%d mem_mib=%zu\n", i, bus, props[i].major,
           props[i].minor, props[i].multiProcessorCount, props[i].totalGlobalMem >> 20);
  }
  bool ok = true;
  ok = matmul(n, props) && ok;
  for (int i = 0; i < n; i++) ok = membw(i) && ok;
  for (int i = 0; i < n; i++) ok = host_copies(i) && ok;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++)
      if (i != j) ok = peer(i, j) && ok;
  if (n > 1) ok = nccl(n) && ok;
  printf("DONE %s\n", ok ? "ok" : "errors");
  return ok ? 0 : 1;
}
