#!/usr/bin/env bash
# Reads a native backtrace (segv_backtrace.c's output, or any glibc backtrace_symbols text) on stdin and
# names its frames: those in ops' library (built with -g) through addr2line, with file and line; every
# other C++ name through c++filt.   usage: symbolize_backtrace.sh [ops/_C.abi3.so] < log
lib="${1:-ops/_C.abi3.so}"
while IFS= read -r line; do
  if [[ "$line" =~ _C\.abi3\.so\(\+(0x[0-9a-fA-F]+)\) ]]; then
    # A return address: the call is the byte before it.
    where=$(addr2line -f -C -i -p -e "$lib" "$(printf '0x%x' $(( ${BASH_REMATCH[1]} - 1 )))" 2>/dev/null | tr '\n' ' ')
    echo "$line  ->  ${where:-?}"
  else
    echo "$line" | c++filt
  fi
done
