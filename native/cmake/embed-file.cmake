# Writes a C++ header holding a file's bytes (cmake -DINPUT=file -DOUTPUT=header -DNAME=symbol
# -P embed-file.cmake): `inline constexpr unsigned char NAME[]` and `NAME##Size`. Used for the
# Metal kernels' metallib, so the engine needs no file beside it at run time.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}"
     "// Generated from ${INPUT} by embed-file.cmake.\n#pragma once\n#include <cstddef>\n"
     "inline constexpr unsigned char ${NAME}[] = {${bytes}};\n"
     "inline constexpr std::size_t ${NAME}Size = ${size};\n")
