#include "gpu/cuda/in_flight.h"

namespace matmul {

void Release(InFlight* flight) {
  if (flight->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete flight;
}

}  // namespace matmul
