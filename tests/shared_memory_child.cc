// shared_memory_child: a client process for SharedMemoryTest.AKilledClients-
// RegionGoes, which kills it, and for the tests that run it as another
// user. Registers the shared-memory object NAME (BYTES long) over the Unix
// socket SOCKET as client CLIENT, keeps the call open, and waits to be
// killed (at most 60 s); if the registration fails it prints
// "register: code N: MESSAGE" (N the gRPC status code) and exits 1.
//
//   shared_memory_child SOCKET NAME BYTES CLIENT
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "matmul/v1/matmul.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s SOCKET NAME BYTES CLIENT\n", argv[0]);
    return 2;
  }
  auto stub = matmul::v1::MatmulService::NewStub(grpc::CreateChannel(
      absl::StrCat("unix:", argv[1]), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.AddMetadata("x-matmul-client", argv[4]);
  matmul::v1::RegisterSharedMemoryRequest request;
  request.set_name(argv[2]);
  request.set_bytes(std::strtoll(argv[3], nullptr, 10));
  auto reader = stub->RegisterSharedMemory(&context, request);
  matmul::v1::RegisterSharedMemoryResponse response;
  if (!reader->Read(&response)) {
    const grpc::Status status = reader->Finish();
    std::fprintf(stderr, "register: code %d: %s\n",
                 static_cast<int>(status.error_code()),
                 status.error_message().c_str());
    return 1;
  }
  std::printf("registered %s\n", response.region().id().c_str());
  std::fflush(stdout);
  absl::SleepFor(absl::Seconds(60));
  return 0;
}
