"""Runs every test here as ``python -m unittest discover -v`` does, and also
writes each test's outcome as JSON to the file named by the first argument:
a list of ``[test id, outcome, detail]``, outcome one of ``ok``, ``skipped``
(detail: the reason), ``fail``, ``error``, ``expected failure``,
``unexpected success``. tests/python.rs checks it: every test passes but
those it names as allowed to skip."""

import json
import os
import signal
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

# Started in the background by a shell without job control (`.ci/run &`
# from a script), this process inherits SIGINT ignored: Python then never
# raises KeyboardInterrupt, and the processes the tests start ignore it
# too. The Ctrl-C tests need Python's own handler, as a terminal gives it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = []

    def note(self, test, outcome, detail=""):
        self.outcomes.append([test.id(), outcome, detail])

    def addSuccess(self, test):
        super().addSuccess(test)
        self.note(test, "ok")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.note(test, "skipped", reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.note(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self.note(test, "error", self._exc_info_to_string(err, test))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self.note(subtest, "fail" if failed else "error", self._exc_info_to_string(err, test))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.note(test, "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.note(test, "unexpected success")


def main():
    out = sys.argv[1]
    suite = unittest.defaultTestLoader.discover(HERE, top_level_dir=HERE)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=Result)
    result = runner.run(suite)
    with open(out, "w") as f:
        json.dump(result.outcomes, f, indent=1)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
