// rawclient with gRPC's callback API, each next call started inside the
// previous call's reaction.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>
static std::vector<char> g_req(1 << 26, 2);
struct St {
  grpc::GenericStub* stub;
  grpc::ByteBuffer req;
  std::vector<double> lat;
  std::chrono::steady_clock::time_point end;
  std::mutex m;
  std::condition_variable cv;
  bool over = false;
};
struct Call {
  grpc::ClientContext ctx;
  grpc::ByteBuffer resp;
  std::chrono::steady_clock::time_point a;
};
void Issue(St* s) {
  auto* c = new Call;
  c->a = std::chrono::steady_clock::now();
  s->stub->UnaryCall(
      &c->ctx, "/ceiling.Echo/Call", grpc::StubOptions(), &s->req, &c->resp,
      [s, c](grpc::Status st) {
        auto now = std::chrono::steady_clock::now();
        if (!st.ok()) {
          fprintf(stderr, "err %s\n", st.error_message().c_str());
          std::exit(1);
        }
        s->lat.push_back(
            std::chrono::duration<double, std::milli>(now - c->a).count());
        delete c;
        if (now < s->end) {
          Issue(s);
          return;
        }
        std::lock_guard<std::mutex> l(s->m);
        s->over = true;
        s->cv.notify_one();
      });
}
int main(int argc, char** argv) {
  const char* addr = argv[1];
  size_t bytes = atol(argv[2]);
  double secs = atof(argv[3]);
  grpc::ChannelArguments ca;
  ca.SetMaxReceiveMessageSize(-1);
  ca.SetMaxSendMessageSize(-1);
  auto ch =
      grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), ca);
  grpc::GenericStub stub(ch);
  St s;
  s.stub = &stub;
  grpc::Slice sl(g_req.data(), bytes, grpc::Slice::STATIC_SLICE);
  s.req = grpc::ByteBuffer(&sl, 1);
  auto t0 = std::chrono::steady_clock::now();
  s.end = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(secs));
  Issue(&s);
  {
    std::unique_lock<std::mutex> l(s.m);
    s.cv.wait(l, [&] { return s.over; });
  }
  double el =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  std::sort(s.lat.begin(), s.lat.end());
  printf("chain bytes=%zu rps=%.0f p50=%.3fms p99=%.3fms\n", bytes,
         s.lat.size() / el, s.lat[s.lat.size() / 2],
         s.lat[s.lat.size() * 99 / 100]);
}
