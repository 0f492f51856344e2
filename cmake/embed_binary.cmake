# cmake -DIN=file -DOUT=file.c -DSYMBOL=name -P embed_binary.cmake
# Writes a C file that defines `const unsigned char SYMBOL[]` holding IN's
# bytes (16-byte aligned: the CUDA runtime reads a fatbin in place).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n  " bytes "${bytes}")
math(EXPR size "${n} / 2")
file(WRITE "${OUT}"
  "/* Generated from ${IN} by cmake/embed_binary.cmake; do not edit. */\n"
  "#include <stddef.h>\n"
  "extern const unsigned char ${SYMBOL}[];\n"
  "extern const size_t ${SYMBOL}_size;\n"
  "_Alignas(16) const unsigned char ${SYMBOL}[] = {\n  ${bytes}\n};\n"
  "const size_t ${SYMBOL}_size = ${size};\n")
