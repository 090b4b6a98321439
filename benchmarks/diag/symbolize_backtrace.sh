#!/usr/bin/env bash
# Reads a native backtrace (segv_backtrace.c's output, or any glibc backtrace_symbols text) on stdin and
# names its frames: those in ops' library (built with -g) through addr2line, with file and line; every
# other C++ name through c++filt.   usage: symbolize_backtrace.sh [ops/_C.abi3.so] < log
# glibc writes a frame in the library as `_C.abi3.so(+0xOFF)` (an offset in the file) or, for an exported
# symbol, `_C.abi3.so(SYMBOL+0xOFF)`: then the offset is SYMBOL's address (nm -D) plus OFF.
lib="${1:-ops/_C.abi3.so}"
symbols="$(nm -D --defined-only "$lib" 2>/dev/null)"
name_return_address() {  # the call is the byte before the return address
  addr2line -f -C -i -p -e "$lib" "$(printf '0x%x' $(( $1 - 1 )))" 2>/dev/null | tr '\n' ' '
}
while IFS= read -r line; do
  if [[ "$line" =~ _C\.abi3\.so\(\+(0x[0-9a-fA-F]+)\) ]]; then
    where=$(name_return_address "${BASH_REMATCH[1]}")
    echo "$line  ->  ${where:-?}"
  elif [[ "$line" =~ _C\.abi3\.so\(([^+\)]+)\+(0x[0-9a-fA-F]+)\) ]]; then
    base=$(awk -v s="${BASH_REMATCH[1]}" '$3 == s {print $1; exit}' <<< "$symbols")
    where=""
    [ -n "$base" ] && where=$(name_return_address $(( 0x$base + ${BASH_REMATCH[2]} )))
    echo "$line  ->  ${where:-?}" | c++filt
  else
    echo "$line" | c++filt
  fi
done
