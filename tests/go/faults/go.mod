module stategate.test/faults

go 1.26.4

require github.com/anishathalye/porcupine v1.3.1
