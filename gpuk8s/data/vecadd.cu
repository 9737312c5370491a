// gpuk8s node GPU check: c = a + b on one GPU, every element checked on the host.
// Prints the result line, then "TIMING GPU <n> kernel_ms=<ms> first_launch_ms=<ms>": the first
// launch (host wall clock, launch to completion: it includes loading the module, and JIT-compiling
// PTX when the binary has no code for this GPU), then one launch timed with CUDA events.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void vecadd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess) {                                                       \
      printf("FAIL %s: %s\n", #call, cudaGetErrorString(err_));                      \
      return 2;                                                                      \
    }                                                                                \
  } while (0)

int main(int argc, char **argv) {
  const int n = 1 << 24;
  int dev = argc > 1 ? atoi(argv[1]) : 0;
  CHECK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  size_t bytes = n * sizeof(float);
  float *a = (float *)malloc(bytes), *b = (float *)malloc(bytes), *c = (float *)malloc(bytes);
  for (int i = 0; i < n; i++) { a[i] = (float)(i % 1024); b[i] = 2.0f * (float)(i % 2048); }
  float *da, *db, *dc;
  CHECK(cudaMalloc(&da, bytes)); CHECK(cudaMalloc(&db, bytes)); CHECK(cudaMalloc(&dc, bytes));
  CHECK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
  auto w0 = std::chrono::steady_clock::now();
  vecadd<<<(n + 255) / 256, 256>>>(da, db, dc, n);  // warm-up: module load (and any JIT)
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0)); CHECK(cudaEventCreate(&t1));
  CHECK(cudaEventRecord(t0));
  vecadd<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  CHECK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
  long bad = 0;
  for (int i = 0; i < n; i++) if (c[i] != a[i] + b[i]) bad++;
  printf("%s GPU %d %s (PCI %04x:%02x:%02x.0, sm_%d%d): vecadd of %d floats: %ld wrong\n",
         bad ? "FAIL" : "OK", dev, prop.name, prop.pciDomainID, prop.pciBusID, prop.pciDeviceID,
         prop.major, prop.minor, n, bad);
  printf("TIMING GPU %d kernel_ms=%.3f first_launch_ms=%.3f\n", dev, ms, first_ms);
  return bad ? 1 : 0;
}
