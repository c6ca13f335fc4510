// Test support: one grpc.health.v1 Check against a channel, 5 s deadline.
#ifndef MATMUL_TESTS_HEALTH_CHECK_H_
#define MATMUL_TESTS_HEALTH_CHECK_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"

namespace matmul::testing {

// The status `service` reports; a failed call fails the test (and reads
// UNKNOWN).
inline grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  EXPECT_TRUE(status.ok()) << service << ": " << status.error_message();
  return response.status();
}

}  // namespace matmul::testing

#endif  // MATMUL_TESTS_HEALTH_CHECK_H_
