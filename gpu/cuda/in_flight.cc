#include "gpu/cuda/in_flight.h"

#include <algorithm>
#include <deque>

#include "absl/synchronization/mutex.h"
#include "gpu/cuda/device.h"
#include "gpu/cuda/lane.h"

namespace matmul {

void CUDART_CB OnStreamDone(void* user_data) {
  auto* flight = static_cast<CudaEngine::InFlight*>(user_data);
  CudaEngine::Device* device = flight->device;
  absl::MutexLock lock(&device->done_mu);
  device->done.push_back(flight);
  device->done_cv.Signal();
}

void HandOff(CudaEngine::InFlight* flight) {
  CudaEngine::Device* device = flight->device;
  device->done_mu.AssertHeld();
  flight->handed_off = true;
  --device->poll_only_unclaimed;  // no longer the poller's to find
  std::deque<CudaEngine::InFlight*>& unclaimed = flight->lane->unclaimed;
  auto it = std::find(unclaimed.begin(), unclaimed.end(), flight);
  if (it != unclaimed.end()) unclaimed.erase(it);
  // The reference a host function's path would hold; the completion
  // thread lets go of it.
  flight->refs.fetch_add(1, std::memory_order_relaxed);
  device->done.push_back(flight);
  device->done_cv.Signal();
}

bool Claim(CudaEngine::InFlight* flight) {
  if (flight->claimed) return false;
  flight->claimed = true;
  if (!flight->host_function && !flight->handed_off) {
    CudaEngine::Device* device = flight->device;
    device->done_mu.AssertHeld();
    --device->poll_only_unclaimed;
  }
  std::deque<CudaEngine::InFlight*>& unclaimed = flight->lane->unclaimed;
  auto it = std::find(unclaimed.begin(), unclaimed.end(), flight);
  if (it != unclaimed.end()) unclaimed.erase(it);
  return true;
}

void Release(CudaEngine::InFlight* flight) {
  if (flight->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete flight;
}

}  // namespace matmul
