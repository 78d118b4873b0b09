"""What the Python tests of the chat-task scripts share: the skip where
training/chat_tasks.py has no corpus, and a collector of failed checks.

  from script_checks import Checks, SKIP, have_corpus
  if not have_corpus():
      return SKIP
  check = Checks()
  check(cond, "what should hold")   # prints FAIL: ... when it does not
  return check.exit_code()          # 1 after any failure, else 0
"""
import os

CORPUS = "/usr/lib/python3.11"  # training/chat_tasks.py's CORPUS_ROOTS
SKIP = 77  # the tests' SKIP_RETURN_CODE in tests/training/CMakeLists.txt


def have_corpus():
    """Whether chat_tasks.py has its corpus; prints the skip when not."""
    if os.path.isdir(CORPUS):
        return True
    print(f"SKIP: no {CORPUS} corpus for chat_tasks.py")
    return False


class Checks:
    """check(cond, what) records and prints a failed check."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        if not cond:
            self.failures.append(what)
            print("FAIL:", what)

    def exit_code(self):
        print("OK" if not self.failures else
              f"{len(self.failures)} failure(s)")
        return 1 if self.failures else 0
