# Makes the stubs protoc wrote under PROTO_DIR a subpackage of matmul_client:
# turns the generated absolute imports ("from matmul.v1 import matmul_pb2",
# "from grpc.health.v1 import health_pb2") into imports from
# matmul_client._proto, and adds the __init__.py files.
# Run as: cmake -DPROTO_DIR=<build>/python/matmul_client/_proto -P package_stubs.cmake
file(GLOB_RECURSE _stubs "${PROTO_DIR}/*_pb2.py" "${PROTO_DIR}/*_pb2_grpc.py")
string(LENGTH "${PROTO_DIR}" _root_length)
foreach(_stub ${_stubs})
  file(READ ${_stub} _text)
  string(REGEX REPLACE "\nfrom (matmul|grpc\\.health)\\." "\nfrom matmul_client._proto.\\1."
         _text "${_text}")
  file(WRITE ${_stub} "${_text}")

  # An __init__.py in the stub's directory and in each one above it.
  get_filename_component(_dir ${_stub} DIRECTORY)
  string(LENGTH "${_dir}" _length)
  while(_length GREATER _root_length)
    file(TOUCH ${_dir}/__init__.py)
    get_filename_component(_dir ${_dir} DIRECTORY)
    string(LENGTH "${_dir}" _length)
  endwhile()
endforeach()
file(TOUCH ${PROTO_DIR}/__init__.py)
