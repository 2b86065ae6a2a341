"""What commands do, by name: which delete, change, copy or write files, which run code
given on their command line, which take a pattern before their files, and which run the
command after them. command_risks.py reads a command with these tables.

Machinery the chapter does not need.
"""

import re

DELETES = {"rm", "rmdir", "unlink", "shred", "truncate", "srm", "wipe"}
CHANGES = {"chmod": "changes permissions", "chown": "changes ownership",
           "chgrp": "changes ownership", "chattr": "changes file attributes",
           "kill": "stops processes", "killall": "stops processes", "pkill": "stops processes"}
COPIES = {"cp", "mv", "install", "ln", "rsync"}     # the last operand is written
# The options that take a value, per command: cp's -f (force) and -T (no target folder) are
# rsync's --filter and --temp-dir, and reading them as taking a value hid cp's target.
COPY_VALUES = {"cp": {"-t", "-S", "--target-directory", "--suffix"},
               "install": {"-t", "-S", "--target-directory", "--suffix", "-m", "-o", "-g",
                           "--mode", "--owner", "--group"},
               "rsync": {"-e", "--rsh", "--exclude", "--include", "--filter", "-f",
                         "--files-from", "--exclude-from", "--include-from", "--rsync-path",
                         "--backup-dir", "--log-file", "--chmod", "--port", "-T", "--temp-dir",
                         "--link-dest", "--compare-dest", "--copy-dest", "--suffix"}}
COPY_VALUES |= {"mv": COPY_VALUES["cp"], "ln": COPY_VALUES["cp"]}
# files of a folder copied over another checked one by one; more asks
COPY_WALK_LIMIT = 10_000
OUTPUT_OPTIONS = {"sort": ("-o", "--output"), "curl": ("-o", "--output"),
                  "wget": ("-O", "--output-document")}
SHELLS = {"bash", "sh", "zsh", "dash", "ksh", "fish"}
# The flags that take a program's code on the command line, per interpreter.
CODE_FLAGS = {"python": {"-c"}, "perl": {"-e", "-E"}, "ruby": {"-e"},
              "node": {"-e", "--eval", "-p", "--print"}, "php": {"-r"}}
INTERPRETER = re.compile(r"^(python|pypy|perl|ruby|node|nodejs|php)[\d.]*$")
LANGUAGE = {"pypy": "python", "nodejs": "node"}
# Words in such code that delete, write, move or run other programs (any of the languages).
RISKY_CODE = re.compile(
    r"\b(unlink\w*|remove\w*|rmdir\w*|rmtree|remove_tree|rm(Sync|_rf|_r|_f)?|truncate\w*|shred|"
    r"rename\w*|move|copy(file|tree|2|FileSync|File)?|write_text|write_bytes|writeFile\w*|"
    r"appendFile\w*|createWriteStream|"
    r"system|popen|subprocess|child_process|spawn\w*|exec\w*|fork|qx|FileUtils|delete|"
    r"__import__|importlib|eval|"
    r"os\.replace|chmod|chown|kill)\b"
    r"|\bopen(Sync)?\b.*?(['\"][rbt]*[wax+][rbtwax+]*['\"]|['\"]\s*(\+?>|\+<))|`|%x")
QUOTED_PATH = re.compile(r"""['"]((?:/[\w.~-]|~/|\.\./)[^'"]*)['"]""")
# Programs whose first operand is a pattern or a program text, not a file: (flags that give
# it instead, flags whose value is a file, flags whose value is neither).
PATTERN_FIRST = {"grep": ({"-e", "--regexp"}, {"-f", "--file"},
                          {"-A", "-B", "-C", "-m", "-d", "-D"}),
                 "sed": ({"-e", "--expression"}, {"-f", "--file"}, {"-l"}),
                 "awk": (set(), {"-f"}, {"-F", "-v"}),
                 "jq": (set(), {"-f", "--from-file"}, {"--arg", "--argjson"})}
PATTERN_FIRST |= {name: PATTERN_FIRST["grep"] for name in ("egrep", "fgrep", "rg", "ag", "ack")}
PATTERN_FIRST |= {name: PATTERN_FIRST["awk"] for name in ("gawk", "mawk", "nawk")}
TEXT_ONLY = {"echo", "printf", "export", "alias", "test", "[", "[[", "true", "false", ":",
             "which", "type", "local", "declare", "readonly", "unset", "return", "exit", "set",
             "shift", "read", "wait", "sleep", "seq"}
# Commands that run the command after them: (flags that take a value, operands before the
# command).
WRAPPERS = {"env": ({"-u", "--unset", "-C", "--chdir"}, 0),
            "nice": ({"-n", "--adjustment"}, 0),
            "nohup": (set(), 0),
            "timeout": ({"-s", "--signal", "-k", "--kill-after"}, 1),
            "time": ({"-f", "--format", "-o"}, 0),
            "command": (set(), 0), "builtin": (set(), 0), "exec": ({"-a"}, 0),
            "stdbuf": ({"-i", "-o", "-e"}, 0), "ionice": ({"-c", "-n", "-p"}, 0),
            "setsid": (set(), 0), "busybox": (set(), 0), "doas": ({"-u"}, 0),
            "xargs": ({"-I", "-i", "-n", "-P", "-L", "-l", "-d", "-s", "-E", "-e", "-a",
                       "--arg-file", "--delimiter", "--max-args", "--max-procs", "--replace"}, 0),
            "flock": ({"-w", "--timeout", "-E", "--conflict-exit-code"}, 1),
            "taskset": (set(), 1), "chrt": (set(), 1), "caffeinate": (set(), 0),
            "unbuffer": (set(), 0), "sg": (set(), 1)}
# A shell's own script read from its input, or from a file made when it runs (<(...)).
STDIN_NAMES = ("-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0")
IN_PLACE_EDITORS = re.compile(r"^(ex|vim?|nvim|ed)$")
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}",
            "esac", "function", "coproc", "select"}
