# `cmake --install` of the C++ client library, as a CMake package:
#
#   <prefix>/include/matmul/          the include root a consumer gets
#     client/lib/*.h                  the client library's public headers
#     common/dtype.h, grpc_args.h     what those headers include from common/
#     proto/dtype_mapping.h           and from proto/
#     matmul/v1/matmul{,.grpc}.pb.h   the generated protobuf and gRPC code
#     grpc/health/v1/health{,.grpc}.pb.h
#   <prefix>/lib/libmatmul_client.a, libmatmul_proto.a
#   <prefix>/lib/cmake/matmul/        matmulConfig.cmake (finds gRPC,
#                                     protobuf and Abseil), its version file,
#                                     matmulTargets*.cmake
#   <prefix>/share/matmul/proto/      matmul/v1/matmul.proto, for clients in
#                                     other languages
#
# find_package(matmul CONFIG) then gives matmul::client (and matmul::proto,
# matmul::common, which it links). Headers are included as in this tree,
# "client/lib/matmul_client.h"; the include root is a folder of its own
# (include/matmul) so that common/ and proto/ never land loose in
# <prefix>/include. Included by the top-level CMakeLists.txt, after the
# client library's targets exist. examples/ is a consumer and
# scripts/check_install.sh builds it against an installed tree.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MATMUL_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/matmul CACHE STRING
    "Where `cmake --install` puts matmulConfig.cmake, relative to the prefix")
set(_matmul_include_root ${CMAKE_INSTALL_INCLUDEDIR}/matmul)

set_target_properties(matmul_client PROPERTIES EXPORT_NAME client)
set_target_properties(matmul_proto PROPERTIES EXPORT_NAME proto)
set_target_properties(matmul_common PROPERTIES EXPORT_NAME common)
install(TARGETS matmul_client matmul_proto matmul_common
  EXPORT matmulTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT client
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT client
  INCLUDES DESTINATION ${_matmul_include_root})

# The client's public headers and, header by header, what they include from
# the rest of the tree (check_install.sh compiles each installed header on
# its own, so a missing one fails CI).
install(FILES
  ${PROJECT_SOURCE_DIR}/client/lib/cuda_memory_session.h
  ${PROJECT_SOURCE_DIR}/client/lib/dtype_conversion.h
  ${PROJECT_SOURCE_DIR}/client/lib/grpc_status.h
  ${PROJECT_SOURCE_DIR}/client/lib/host_tensor.h
  ${PROJECT_SOURCE_DIR}/client/lib/matmul_client.h
  ${PROJECT_SOURCE_DIR}/client/lib/multiply_encoding.h
  ${PROJECT_SOURCE_DIR}/client/lib/shared_memory_object.h
  ${PROJECT_SOURCE_DIR}/client/lib/shared_memory_session.h
  ${PROJECT_SOURCE_DIR}/client/lib/tensor_proto.h
  DESTINATION ${_matmul_include_root}/client/lib COMPONENT client)
install(FILES
  ${PROJECT_SOURCE_DIR}/common/dtype.h
  ${PROJECT_SOURCE_DIR}/common/grpc_args.h
  DESTINATION ${_matmul_include_root}/common COMPONENT client)
install(FILES ${PROJECT_SOURCE_DIR}/proto/dtype_mapping.h
  DESTINATION ${_matmul_include_root}/proto COMPONENT client)
# The generated headers: proto/CMakeLists.txt writes them under gen/.
get_target_property(_matmul_proto_bin matmul_proto BINARY_DIR)
install(DIRECTORY ${_matmul_proto_bin}/gen/
  DESTINATION ${_matmul_include_root} COMPONENT client
  FILES_MATCHING PATTERN "*.pb.h")
install(FILES ${PROJECT_SOURCE_DIR}/proto/matmul/v1/matmul.proto
  DESTINATION ${CMAKE_INSTALL_DATADIR}/matmul/proto/matmul/v1
  COMPONENT client)

install(EXPORT matmulTargets
  NAMESPACE matmul::
  DESTINATION ${MATMUL_INSTALL_CMAKEDIR}
  COMPONENT client)
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/matmulConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/matmulConfig.cmake
  INSTALL_DESTINATION ${MATMUL_INSTALL_CMAKEDIR})
# 0.x: a minor release may break the API, so only the same minor matches.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/matmulConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/cmake/matmulConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/matmulConfigVersion.cmake
  DESTINATION ${MATMUL_INSTALL_CMAKEDIR} COMPONENT client)
