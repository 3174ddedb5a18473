module stategate.test/faults

go 1.26.4
