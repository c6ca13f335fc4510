// Tests of matmul-bench's workload (shape parsing, request building), its
// response verification, and the figures of its report.
#include "bench/service/bench_workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/service/bench_report.h"
#include "bench/service/server_scrape.h"
#include "client/lib/tensor_proto.h"
#include "common/element.h"
#include "nlohmann/json.hpp"

namespace matmul {
namespace {

double Element(DType dtype, const std::string& data, int64_t i) {
  return LoadElement(dtype, data.data() + i * DTypeSize(dtype));
}

void SetElement(DType dtype, std::string& data, int64_t i, double value) {
  StoreElement(dtype, value, data.data() + i * DTypeSize(dtype));
}

// What a correct server answers: the product accumulated in float32 (or
// float64 for float64), rounded to the dtype.
v1::MultiplyResponse CorrectResponse(const Workload& w, int index) {
  const BenchShape& s = w.shapes.empty() ? w.shape : w.shapes[index];
  const v1::MultiplyRequest& r = *w.requests[index];
  v1::MultiplyResponse response;
  v1::Tensor* c = response.mutable_c();
  if (s.batch > 0) c->add_shape(s.batch);
  c->add_shape(s.m);
  c->add_shape(s.n);
  c->set_dtype(DTypeToProto(w.dtype));
  std::string data(s.matrices() * s.m * s.n * DTypeSize(w.dtype), '\0');
  for (int64_t p = 0; p < s.matrices(); ++p) {
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double sum64 = 0;
        float sum32 = 0;
        for (int64_t q = 0; q < s.k; ++q) {
          const double a =
              Element(w.dtype, r.a().data(), (p * s.m + i) * s.k + q);
          const double b =
              Element(w.dtype, r.b().data(), (p * s.k + q) * s.n + j);
          sum64 += a * b;
          sum32 += static_cast<float>(a) * static_cast<float>(b);
        }
        SetElement(w.dtype, data, (p * s.m + i) * s.n + j,
                   w.dtype == DType::kFloat64 ? sum64 : sum32);
      }
    }
  }
  *c->mutable_data() = std::move(data);
  return response;
}

TEST(ParseShapeTest, Forms) {
  absl::StatusOr<BenchShape> s = ParseShape("256");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->batch, 0);
  EXPECT_EQ(s->m, 256);
  EXPECT_EQ(s->k, 256);
  EXPECT_EQ(s->n, 256);
  EXPECT_EQ(s->ToString(), "256x256x256");

  s = ParseShape("2x3X4");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->m, 2);
  EXPECT_EQ(s->k, 3);
  EXPECT_EQ(s->n, 4);

  s = ParseShape("8x2x3x4");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->batch, 8);
  EXPECT_EQ(s->matrices(), 8);
  EXPECT_EQ(s->ToString(), "8x2x3x4");

  for (const char* bad : {"", "0", "2x3", "1x2x3x4x5", "-1x2x3", "ax2x3",
                          "2x3x", "99999999x99999999x99999999"}) {
    EXPECT_FALSE(ParseShape(bad).ok()) << bad;
  }
}

TEST(ParseShapeTest, DTypesAndModes) {
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("float64"), DType::kFloat64);
  EXPECT_FALSE(ParseDType("int8").ok());
  EXPECT_EQ(*ParseComputeMode("tf32"), ComputeMode::kTf32);
  EXPECT_FALSE(ParseComputeMode("fast").ok());
}

TEST(BuildWorkloadTest, RequestsMatchTheShape) {
  const BenchShape shape = *ParseShape("3x5x7x2");
  absl::StatusOr<Workload> w =
      BuildWorkload(shape, DType::kFloat16, ComputeMode::kStrict, 3, 42);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->requests.size(), 3u);
  EXPECT_EQ(w->request_bytes, 3 * (5 * 7 + 7 * 2) * 2);
  EXPECT_EQ(w->response_bytes, 3 * 5 * 2 * 2);
  EXPECT_DOUBLE_EQ(w->flops_per_request, 2.0 * 3 * 5 * 7 * 2);
  const v1::MultiplyRequest& r = *w->requests[0];
  EXPECT_EQ(std::vector<int64_t>(r.a().shape().begin(), r.a().shape().end()),
            (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(std::vector<int64_t>(r.b().shape().begin(), r.b().shape().end()),
            (std::vector<int64_t>{3, 7, 2}));
  EXPECT_EQ(r.a().dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(static_cast<int64_t>(r.a().data().size() + r.b().data().size()),
            w->request_bytes);
  // Distinct requests differ; the same seed gives the same bytes.
  EXPECT_NE(w->requests[0]->a().data(), w->requests[1]->a().data());
  absl::StatusOr<Workload> again =
      BuildWorkload(shape, DType::kFloat16, ComputeMode::kStrict, 1, 42);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->requests[0]->a().data(), w->requests[0]->a().data());
  EXPECT_FALSE(
      BuildWorkload(shape, DType::kFloat16, ComputeMode::kStrict, 0, 1).ok());
}

class VerifierTest : public ::testing::TestWithParam<DType> {};

TEST_P(VerifierTest, AcceptsRightAndCatchesWrongAnswers) {
  const DType dtype = GetParam();
  for (const char* shape_text : {"37x129x23", "2x16x300x9"}) {
    SCOPED_TRACE(shape_text);
    absl::StatusOr<Workload> w = BuildWorkload(*ParseShape(shape_text), dtype,
                                               ComputeMode::kStrict, 2, 7);
    ASSERT_TRUE(w.ok()) << w.status();
    absl::StatusOr<std::unique_ptr<ResponseVerifier>> v =
        ResponseVerifier::Create(*w);
    ASSERT_TRUE(v.ok()) << v.status();

    const v1::MultiplyResponse right = CorrectResponse(*w, 1);
    EXPECT_TRUE((*v)->Check(1, right).ok()) << (*v)->Check(1, right);
    // The answer to the other request is wrong for this one.
    EXPECT_EQ((*v)->Check(0, right).code(), absl::StatusCode::kDataLoss);

    // One element off by a little more than a wrong-answer's typical error.
    v1::MultiplyResponse one_off = right;
    std::string& data = *one_off.mutable_c()->mutable_data();
    const double old = Element(dtype, data, 5);
    SetElement(dtype, data, 5, old + 0.5);
    absl::Status status = (*v)->Check(1, one_off);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(status.message().find("1 of "), std::string::npos) << status;

    // NaN is never right.
    v1::MultiplyResponse nan = right;
    SetElement(dtype, *nan.mutable_c()->mutable_data(), 0,
               std::numeric_limits<double>::quiet_NaN());
    EXPECT_FALSE((*v)->Check(1, nan).ok());

    // Wrong shape, dtype or size.
    v1::MultiplyResponse bad_shape = right;
    bad_shape.mutable_c()->set_shape(bad_shape.c().shape_size() - 1, 1);
    EXPECT_FALSE((*v)->Check(1, bad_shape).ok());
    v1::MultiplyResponse bad_dtype = right;
    bad_dtype.mutable_c()->set_dtype(
        dtype == DType::kFloat64 ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT64);
    EXPECT_FALSE((*v)->Check(1, bad_dtype).ok());
    v1::MultiplyResponse short_data = right;
    short_data.mutable_c()->mutable_data()->pop_back();
    EXPECT_FALSE((*v)->Check(1, short_data).ok());
    EXPECT_FALSE((*v)->Check(2, right).ok());  // no such request
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, VerifierTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat64,
                                           DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(Tf32VerifierTest, RoundedInputErrorsAreTolerated) {
  // Inputs rounded to 10 mantissa bits, as TF32 tensor cores take them,
  // still pass in tf32 mode.
  const BenchShape shape = *ParseShape("16x4096x16");
  absl::StatusOr<Workload> w =
      BuildWorkload(shape, DType::kFloat32, ComputeMode::kTf32, 1, 3);
  ASSERT_TRUE(w.ok());
  Workload rounded;
  rounded.shape = shape;
  rounded.dtype = DType::kFloat32;
  rounded.requests.push_back(
      std::make_unique<v1::MultiplyRequest>(*w->requests[0]));
  for (std::string* d : {rounded.requests[0]->mutable_a()->mutable_data(),
                         rounded.requests[0]->mutable_b()->mutable_data()}) {
    for (size_t i = 0; i < d->size() / 4; ++i) {
      uint32_t u;
      std::memcpy(&u, d->data() + 4 * i, 4);
      u = (u + 0x1000u) & ~0x1fffu;  // round to 10 mantissa bits
      std::memcpy(d->data() + 4 * i, &u, 4);
    }
  }
  const v1::MultiplyResponse tf32_answer = CorrectResponse(rounded, 0);
  absl::StatusOr<std::unique_ptr<ResponseVerifier>> v =
      ResponseVerifier::Create(*w);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE((*v)->Check(0, tf32_answer).ok()) << (*v)->Check(0, tf32_answer);
}

TEST(BenchReportTest, Metrics) {
  BenchRun run;
  run.shape = *ParseShape("1024");
  run.request_bytes = 8 << 20;
  run.response_bytes = 4 << 20;
  run.flops_per_request = 2.0 * 1024 * 1024 * 1024;
  BenchPoint point;
  point.point.concurrency = 16;
  point.result.elapsed = absl::Seconds(2);
  point.result.ok_in_window = 1000;
  for (int i = 1; i <= 1000; ++i) point.result.latency_ns.Record(i * 10000);
  const PointMetrics m = ComputeMetrics(run, point);
  EXPECT_DOUBLE_EQ(m.requests_per_s, 500);
  EXPECT_DOUBLE_EQ(m.request_gb_per_s, 500.0 * (8 << 20) / 1e9);
  EXPECT_DOUBLE_EQ(m.response_gb_per_s, 500.0 * (4 << 20) / 1e9);
  EXPECT_DOUBLE_EQ(m.total_gb_per_s, m.request_gb_per_s + m.response_gb_per_s);
  EXPECT_NEAR(m.tflop_per_s, 500 * 2.147483648e9 / 1e12, 1e-9);
  EXPECT_NEAR(m.p50_ms, 5.0, 0.05);
  EXPECT_NEAR(m.p99_ms, 9.9, 0.1);
  EXPECT_LE(m.p50_ms, m.p90_ms);
  EXPECT_LE(m.p99_ms, m.p999_ms);

  point.result.errors_by_code["UNAVAILABLE"] = 3;
  const std::string json = ReportJson(run, {point});
  const nlohmann::json doc = nlohmann::json::parse(json);
  EXPECT_EQ(doc.at("schema"), "matmul-bench/1");
  ASSERT_EQ(doc.at("points").size(), 1u);
  const nlohmann::json& p = doc.at("points")[0];
  EXPECT_EQ(p.at("errors_by_code"), nlohmann::json({{"UNAVAILABLE", 3}}));
  EXPECT_DOUBLE_EQ(p.at("requests_per_s").get<double>(), 500);
  EXPECT_DOUBLE_EQ(p.at("total_gb_per_s").get<double>(), m.total_gb_per_s);
  EXPECT_EQ(p.at("concurrency"), 16);
  EXPECT_EQ(p.at("latency_ms").at("count"), 1000);
  EXPECT_NE(TableRow(run, point).find("500.0"), std::string::npos);
}

// The document's layout: pretty-printed, two-space indent, keys in the
// order bench_report.h documents, one trailing newline; a figure that is
// not finite is null; bytes that are not UTF-8 do not stop the report.
TEST(BenchReportTest, JsonLayoutOrderNullsAndBytes) {
  BenchRun run;
  run.shape = *ParseShape("8x4x2");
  run.label = "l\"\\\n\xff";
  run.command_line = {"matmul-bench", "--label", run.label};
  run.flops_per_request = std::numeric_limits<double>::quiet_NaN();
  BenchPoint point;
  point.point.concurrency = 2;
  point.point.rate = 50;
  point.point.requests = 7;
  point.result.elapsed = absl::Seconds(1);
  point.result.ok_in_window = 7;
  point.result.error_messages["INTERNAL"] = "bad \xc3";
  const std::string json = ReportJson(run, {point});
  const std::string head = "{\n  \"schema\": \"matmul-bench/1\",\n";
  EXPECT_EQ(json.substr(0, head.size()), head);
  EXPECT_EQ(json.back(), '\n');
  EXPECT_NE(json[json.size() - 2], '\n');

  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(json);
  std::vector<std::string> keys;
  for (const auto& [key, value] : doc.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "schema", "tool", "label", "timestamp", "host", "target",
                      "command_line", "config", "server", "points"}));
  const std::string replaced = "l\"\\\n\xef\xbf\xbd";  // U+FFFD
  EXPECT_EQ(doc.at("label"), replaced);
  EXPECT_EQ(doc.at("command_line")[2], replaced);
  EXPECT_TRUE(doc.at("config").at("flops_per_request").is_null());
  const nlohmann::ordered_json& p = doc.at("points")[0];
  EXPECT_EQ(p.at("mode"), "open");
  EXPECT_EQ(p.at("rate"), 50.0);
  EXPECT_TRUE(p.at("duration_s").is_null());
  EXPECT_EQ(p.at("requests_target"), 7);
  EXPECT_TRUE(p.at("tflop_per_s").is_null());
  EXPECT_EQ(p.at("error_messages").at("INTERNAL"), "bad \xef\xbf\xbd");
  std::vector<std::string> point_keys;
  for (const auto& [key, value] : p.items()) point_keys.push_back(key);
  ASSERT_GE(point_keys.size(), 12u);
  EXPECT_EQ(
      std::vector<std::string>(point_keys.begin(), point_keys.begin() + 12),
      (std::vector<std::string>{"label", "timestamp", "host", "target", "shape",
                                "batch", "m", "k", "n", "dtype", "compute",
                                "mode"}));
  EXPECT_EQ(point_keys.back(), "server");
}

TEST(ResidentTest, NamesAndRequests) {
  EXPECT_EQ(*ParseResident("none"), Resident::kNone);
  EXPECT_EQ(*ParseResident("operands"), Resident::kOperands);
  EXPECT_EQ(*ParseResident("all"), Resident::kAll);
  EXPECT_FALSE(ParseResident("some").ok());
  for (Resident r : {Resident::kNone, Resident::kOperands, Resident::kAll}) {
    EXPECT_EQ(*ParseResident(ResidentName(r)), r);
  }

  absl::StatusOr<Workload> w = BuildWorkload(
      *ParseShape("4x5x6"), DType::kFloat32, ComputeMode::kTf32, 2, /*seed=*/3);
  ASSERT_TRUE(w.ok());
  absl::StatusOr<std::vector<std::unique_ptr<v1::MultiplyRequest>>> kept =
      ResidentRequests(*w, {"h-a0", "h-a1"}, {"h-b0", "h-b1"}, true, 70);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_EQ(kept->size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const v1::MultiplyRequest& r = *(*kept)[i];
    EXPECT_EQ(r.a_handle(), absl::StrCat("h-a", i));
    EXPECT_EQ(r.b_handle(), absl::StrCat("h-b", i));
    EXPECT_FALSE(r.has_a());
    EXPECT_FALSE(r.has_b());
    EXPECT_TRUE(r.keep_result());
    EXPECT_EQ(r.result_ttl_seconds(), 70);
    EXPECT_EQ(r.compute_mode(), v1::COMPUTE_MODE_TF32);
    EXPECT_EQ(r.transpose_a(), w->requests[i]->transpose_a());
    EXPECT_LT(r.ByteSizeLong(), 100u);
  }
  absl::StatusOr<std::vector<std::unique_ptr<v1::MultiplyRequest>>> inline_c =
      ResidentRequests(*w, {"h-a0", "h-a1"}, {"h-b0", "h-b1"}, false, 70);
  ASSERT_TRUE(inline_c.ok());
  EXPECT_FALSE((*inline_c)[0]->keep_result());
  EXPECT_EQ((*inline_c)[0]->result_ttl_seconds(), 0);
  EXPECT_FALSE(ResidentRequests(*w, {"h-a0"}, {"h-b0", "h-b1"}, true, 0).ok());
}

TEST(BenchReportTest, ResidentFields) {
  BenchRun run;
  run.shape = *ParseShape("64");
  run.resident = Resident::kAll;
  run.client_id = "bench-x";
  run.flops_per_request = 2.0 * 64 * 64 * 64;
  BenchPoint point;
  point.result.elapsed = absl::Seconds(1);
  point.result.ok_in_window = 1000;
  point.request_message_bytes = 80;
  point.result.response_message_bytes = 120;
  point.result.deletes = 1010;
  point.result.deletes_ok = 1008;
  point.result.delete_errors = 2;
  point.result.delete_errors_by_code["NOT_FOUND"] = 2;
  point.result.delete_error_messages["NOT_FOUND"] = "gone";
  point.resident_operands = {"h-1", "h-2"};
  const PointMetrics m = ComputeMetrics(run, point);
  EXPECT_DOUBLE_EQ(m.total_gb_per_s, 0);
  EXPECT_DOUBLE_EQ(m.wire_gb_per_s, 1000.0 * 200 / 1e9);
  const std::string json = ReportJson(run, {point});
  for (const char* want :
       {"\"resident\": \"all\"", "\"client_id\": \"bench-x\"",
        "\"request_message_bytes\": 80", "\"response_message_bytes\": 120",
        "\"issued\": 1010", "\"NOT_FOUND\": 2", "\"h-2\"",
        "\"max_handles_per_client\""}) {
    EXPECT_NE(json.find(want), std::string::npos) << want << "\n" << json;
  }
  EXPECT_NE(ErrorLines(point).find("Delete of a kept product: NOT_FOUND x2"),
            std::string::npos);
  EXPECT_NE(RunDescription(run).find("products kept and deleted"),
            std::string::npos);
}

TEST(BenchReportTest, StreamFields) {
  BenchRun run;
  run.shape = *ParseShape("64");
  BenchPoint point;
  point.result.elapsed = absl::Seconds(1);
  point.result.ok_in_window = 10;
  // Unary: not streamed, no stream settings.
  nlohmann::ordered_json doc =
      nlohmann::ordered_json::parse(ReportJson(run, {point}));
  EXPECT_EQ(doc.at("config").at("streamed"), false);
  EXPECT_TRUE(doc.at("config").at("stream").is_null());
  EXPECT_EQ(doc.at("points")[0].at("streamed"), false);
  EXPECT_TRUE(doc.at("points")[0].at("stream").is_null());
  EXPECT_EQ(RunDescription(run).find("streamed"), std::string::npos);

  run.stream = StreamOptions{int64_t{1} << 20, 3};
  doc = nlohmann::ordered_json::parse(ReportJson(run, {point}));
  for (const nlohmann::ordered_json* j :
       {&doc.at("config"), &doc.at("points")[0]}) {
    EXPECT_EQ(j->at("streamed"), true);
    EXPECT_EQ(j->at("stream").at("stripes"), 3);
    EXPECT_EQ(j->at("stream").at("chunk_bytes"), 1 << 20);
  }
  EXPECT_NE(RunDescription(run).find(
                "streamed (MultiplyStream) over 3 stripe(s), 1.0 MiB chunks"),
            std::string::npos)
      << RunDescription(run);
}

TEST(ShapeMixTest, ParsesAndNames) {
  absl::StatusOr<std::vector<BenchShape>> mix =
      ParseShapeMix("64,128,256x32x512,512");
  ASSERT_TRUE(mix.ok()) << mix.status();
  ASSERT_EQ(mix->size(), 4u);
  EXPECT_EQ((*mix)[0].ToString(), "64x64x64");
  EXPECT_EQ((*mix)[2].m, 256);
  EXPECT_EQ((*mix)[2].k, 32);
  EXPECT_EQ((*mix)[2].n, 512);
  EXPECT_EQ(ShapeMixName(*mix), "64x64x64,128x128x128,256x32x512,512x512x512");
  for (const char* bad : {"", ",", "64,", "64,,128", "64,0", "64,abc"}) {
    EXPECT_EQ(ParseShapeMix(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
  std::string many = "8";
  for (int i = 0; i < 64; ++i) many += ",8";
  EXPECT_FALSE(ParseShapeMix(many).ok());  // 65 shapes
}

// Requests take the mix's shapes in turn; sizes and flops are the mix's
// means; the verifier checks each against its own shape.
TEST(ShapeMixTest, WorkloadTakesTheShapesInTurnAndVerifiesEach) {
  absl::StatusOr<std::vector<BenchShape>> mix = ParseShapeMix("4,6x5x3,8");
  ASSERT_TRUE(mix.ok());
  absl::StatusOr<Workload> w = BuildMixedWorkload(
      *mix, DType::kFloat32, ComputeMode::kStrict, /*distinct=*/2, 7);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->requests.size(), 6u);
  ASSERT_EQ(w->shapes.size(), 6u);
  EXPECT_EQ(w->mix.size(), 3u);
  for (size_t i = 0; i < 6; ++i) {
    const BenchShape& s = (*mix)[i % 3];
    EXPECT_EQ(w->shapes[i].ToString(), s.ToString());
    const v1::MultiplyRequest& r = *w->requests[i];
    EXPECT_EQ(r.a().shape(0), s.m);
    EXPECT_EQ(r.a().shape(1), s.k);
    EXPECT_EQ(r.b().shape(0), s.k);
    EXPECT_EQ(r.b().shape(1), s.n);
  }
  const double flops = (2.0 * 64 + 2.0 * 6 * 5 * 3 + 2.0 * 512) / 3;
  EXPECT_DOUBLE_EQ(w->flops_per_request, flops);
  const int64_t request_bytes = ((16 + 16) + (30 + 15) + (64 + 64)) * 4;
  EXPECT_EQ(w->request_bytes, (request_bytes + 1) / 3);

  absl::StatusOr<std::unique_ptr<ResponseVerifier>> v =
      ResponseVerifier::Create(*w);
  ASSERT_TRUE(v.ok()) << v.status();
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE((*v)->Check(i, CorrectResponse(*w, i)).ok()) << i;
  }
  // Another shape's correct answer is wrong here.
  EXPECT_EQ((*v)->Check(1, CorrectResponse(*w, 0)).code(),
            absl::StatusCode::kDataLoss);

  // One shape: the same requests BuildWorkload makes.
  absl::StatusOr<Workload> one = BuildMixedWorkload(
      {(*mix)[0]}, DType::kFloat32, ComputeMode::kStrict, 2, 7);
  absl::StatusOr<Workload> plain =
      BuildWorkload((*mix)[0], DType::kFloat32, ComputeMode::kStrict, 2, 7);
  ASSERT_TRUE(one.ok() && plain.ok());
  EXPECT_TRUE(one->mix.empty());
  EXPECT_EQ(one->requests[1]->a().data(), plain->requests[1]->a().data());
}

TEST(ShapeMixTest, ReportNamesTheMix) {
  BenchRun run;
  run.shape_mix = *ParseShapeMix("64,128");
  run.shape = run.shape_mix.front();
  EXPECT_NE(RunDescription(run).find("shape mix 64x64x64,128x128x128"),
            std::string::npos);
  BenchPoint point;
  point.point.concurrency = 64;
  ServerDelta d;
  d.multiplies_ok = 100;
  d.compute_us_per_request = 2.5;
  d.launches = 3;
  point.server_delta = d;
  const nlohmann::json j = nlohmann::json::parse(ReportJson(run, {point}));
  const nlohmann::json& p = j["points"][0];
  ASSERT_EQ(p["shape_mix"].size(), 2u);
  EXPECT_EQ(p["shape_mix"][1], "128x128x128");
  EXPECT_EQ(p["server_metrics"]["compute_us_per_request"], 2.5);
  EXPECT_EQ(p["server_metrics"]["launches"], 3);
  EXPECT_NE(ServerLine(point).find("2.50 us/request"), std::string::npos);
  // Without the flags: neither key.
  BenchRun plain;
  const nlohmann::json k =
      nlohmann::json::parse(ReportJson(plain, {BenchPoint{}}));
  EXPECT_FALSE(k["points"][0].contains("shape_mix"));
  EXPECT_FALSE(k["points"][0].contains("server_metrics"));
  EXPECT_EQ(ServerLine(BenchPoint{}), "");
}

TEST(ServerScrapeTest, ParsesTargetsAndCounters) {
  absl::StatusOr<ScrapeTarget> t = ParseScrapeTarget("127.0.0.1:9464");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "127.0.0.1");
  EXPECT_EQ(t->port, 9464);
  EXPECT_EQ(t->path, "/metrics");
  t = ParseScrapeTarget("http://[::1]:80/other");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "::1");
  EXPECT_EQ(t->port, 80);
  EXPECT_EQ(t->path, "/other");
  for (const char* bad : {"", "host", ":80", "host:0", "host:x", "h:70000"}) {
    EXPECT_FALSE(ParseScrapeTarget(bad).ok()) << bad;
  }

  const char* kBefore =
      "# HELP matmul_device_compute_busy_seconds_total x\n"
      "# TYPE matmul_device_compute_busy_seconds_total counter\n"
      "matmul_device_compute_busy_seconds_total{device=\"0\",uuid=\"a\"} 1.5\n"
      "matmul_device_compute_busy_seconds_total{device=\"1\",uuid=\"b\"} 0.5\n"
      "matmul_device_busy_seconds_total{device=\"0\",uuid=\"a\"} 3\n"
      "matmul_requests_total{method=\"Multiply\",code=\"OK\"} 1000\n"
      "matmul_requests_total{method=\"Multiply\",code=\"CANCELLED\"} 7\n"
      "matmul_requests_total{method=\"Upload\",code=\"OK\"} 9\n"
      "matmul_requests_total{method=\"MultiplyStream\",code=\"OK\"} 40\n"
      "matmul_requests_total{method=\"MultiplyStream\",code=\"CANCELLED\"} "
      "2\n"
      "matmul_stream_jobs_total{device=\"0\",stream=\"0\",uuid=\"a\"} 40\n"
      "matmul_stream_jobs_total{device=\"0\",stream=\"1\",uuid=\"a\"} 60\n"
      "matmul_batch_size_bucket{le=\"1\"} 10\n"
      "matmul_batch_size_sum 900\n"
      "matmul_batch_size_count 100\n";
  const ServerCounters before = ParseServerCounters(kBefore);
  EXPECT_DOUBLE_EQ(before.compute_busy_s, 2.0);
  EXPECT_DOUBLE_EQ(before.device_busy_s, 3.0);
  EXPECT_DOUBLE_EQ(before.multiplies_ok, 1000);
  EXPECT_DOUBLE_EQ(before.stream_multiplies_ok, 40);
  EXPECT_DOUBLE_EQ(before.engine_jobs, 100);
  EXPECT_DOUBLE_EQ(before.launches, 100);
  EXPECT_DOUBLE_EQ(before.launched_requests, 900);

  ServerCounters after = before;
  after.multiplies_ok += 500;
  after.compute_busy_s += 0.01;
  after.device_busy_s += 0.02;
  after.engine_jobs += 25;
  after.launches += 5;
  const ServerDelta d = Subtract(before, after);
  EXPECT_DOUBLE_EQ(d.multiplies_ok, 500);
  EXPECT_NEAR(d.compute_us_per_request, 20.0, 1e-9);
  EXPECT_NEAR(d.device_busy_us_per_request, 40.0, 1e-9);
  EXPECT_DOUBLE_EQ(d.jobs_per_request, 0.05);
  EXPECT_DOUBLE_EQ(d.launches, 5);
  // Nothing finished: no ratios.
  EXPECT_EQ(Subtract(before, before).compute_us_per_request, 0);
  // --stream: the streamed multiplies are the denominator.
  after.stream_multiplies_ok += 4;
  const ServerDelta streamed = Subtract(before, after, /*streamed=*/true);
  EXPECT_DOUBLE_EQ(streamed.multiplies_ok, 4);
  EXPECT_NEAR(streamed.compute_us_per_request, 2500.0, 1e-9);
  EXPECT_DOUBLE_EQ(Subtract(before, after).multiplies_ok, 500);
}

}  // namespace
}  // namespace matmul
