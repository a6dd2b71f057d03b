# Properties of single tests that differ from those of their executable's (gtest_discover_tests
# gives all of one executable's tests the same), read after the discovered tests.

# Run with nothing beside them (RUN_SERIAL): each makes its own processes differ in speed on the
# machine's cores and checks what trainctl does with the difference; a neighbour under
# `ctest -j2` (the live cluster's pods above all) loads those cores too, and can all but even the
# difference out: in one CI run, beside a live test, worker 1 with four busy processes on its
# core ran only some 13 % slower than worker 0, and balance: speed rightly kept the parts almost
# even.
set_tests_properties(Trainer.BalanceBySpeedGivesASlowerWorkerLessOfTheBatchAndTrainsTheSame
                     PROPERTIES RUN_SERIAL TRUE)

# Six launches of torch 2.x programs, two of them compiling with inductor (some 35 s each on two
# cores).
set_tests_properties(Preload.TodaysProgramsGiveTorchrunsResultsFromAWarmInterpreter.torch2 PROPERTIES TIMEOUT 400)
