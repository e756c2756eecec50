"""The word lists the archive generator draws its text from (see ``archive.py``).

Each list is in rough order of how often the word shows up in coding-agent sessions, most
frequent first: the generator samples them by Zipf rank, so the order is what makes common
words common. Inflected forms of the technical verbs are derived (``inflections``), and
identifiers, class names and paths are composed per project from ``ID_VERBS`` and
``ID_NOUNS``, so an archive holds tens of thousands of distinct tokens from these few lists.
"""

from __future__ import annotations


def _words(text: str) -> tuple[str, ...]:
    """The words of ``text`` in order, each kept once (a word listed twice keeps its first rank)."""
    return tuple(dict.fromkeys(text.split()))


PROSE = _words("""
the to and a of is in it that for this i you be we with on not as are can so if but the it's
have at from will or should now let's do what was there which then an all need by one just me
my when like more also here some into only its any use make see because would than look how
these could other they them first new check sure want think get may about up out instead still
well before after both same there's two each way again then right thanks without already where
thing does while since every next last might also fine going actually probably please okay ok
yes no maybe currently really rather quite likely already something nothing everything anything
someone anyone done found looks seems seem keep try tried trying work works working worked
happen happens happened change changes changed changing figure understand mean means meant
explain show shows showed know knew tell told said says give given goes went come came take
took put set run running ran call calls called point points case cases part parts place end
start started starting stop stopped long short small large big little less least most much
many few several enough whole half other another such own different similar simple clear easy
hard possible able good bad better best worse wrong correct exactly directly simply finally
quickly slowly usually always never sometimes often once twice far near between through over
under above below around against along across behind beside during until though although
however therefore otherwise unless whether either neither nor yet still even just almost also
too very so quite rather pretty kind sort bit lot lots way ways time times day days week today
yesterday tomorrow morning later soon earlier early late minute minutes hour hours second
seconds moment idea reason question answer problem problems issue solution approach step
steps plan goal result results effect side detail details example examples note notes list
order number numbers amount rest top bottom front back left right inside outside beginning
middle end line whole area piece group set level kind type form way part area point fact
people person team someone user everyone everybody nobody we'll we're i'll i'm i've you're
you'll they're that's what's here's isn't aren't wasn't weren't don't doesn't didn't won't
can't couldn't shouldn't wouldn't haven't hasn't hadn't let us our ours your yours their his
her him she he who whom whose which whatever whenever wherever however why how
mind consider decide decided remember forget forgot notice noticed expect expected assume
assumed suppose prefer agree guess wonder hope wish feel felt care matter matters mind
move moved keep kept leave left bring brought hold held turn turned follow followed lead
leads stay stayed wait waiting ask asked asking answer answered reply replied write wrote
written read reading reads open opened close closed begin began finish finished complete
completed continue continued return returned send sent receive received miss missed lose
lost win save saved spend spent pay paid buy cost costs own owned share shared grow grew
add added include included including contain contains containing cover covered reach
reached allow allowed allows prevent prevented avoid avoided require required requires need
needed needs provide provided provides support supported supports handle handled compare
compared describe described mention mentioned suggest suggested recommend recommended
confirm confirmed verify verified double quick quickly careful carefully safe safely
important main major minor real actual actually original final initial current recent
previous next following above below last latest earlier later older newer same different
whole entire single multiple various certain specific general common rare unusual usual
normal strange weird odd obvious clear unclear visible hidden empty full broken fixed stable
ready done clean dirty fresh stale valid invalid missing extra additional optional required
available unavailable enabled disabled active inactive public private local global remote
internal external manual automatic direct indirect explicit implicit exact approximate
nice great fine perfect awesome cool weird annoying tricky messy noisy slow fast faster
slower cheap expensive heavy light small tiny huge massive
""")

TECH = _words("""
file files test tests code error function build config the output command value type module
import path run script server data request response api errors method class string line
lines repo directory folder package dependency dependencies install version branch commit
changes diff patch fix bug issue feature refactor cleanup log logs logging debug warning
message messages event events handler callback async await promise thread process memory
buffer stream socket connection timeout retry retries cache key token tokens user session
database query schema migration table column row rows index field fields struct enum trait
interface implementation generic object array list map dict json yaml toml csv parser
parse parsing serialize encoding bytes chunk offset length size limit count id uuid hash
checksum auth permission role header headers body payload status exception stack trace
traceback panic crash fixture mock stub assert assertion expected actual failing failed
passing flaky snapshot unit integration suite spec coverage lint linter formatter compile
compiler binary target release flag option argument parameter default env environment
variable setting settings cli stdout stderr exit signal pid port host url endpoint route
router middleware service container image docker deploy deployment pipeline ci job task
worker queue lock mutex transaction merge rebase upstream origin main master tag release
changelog readme docs documentation comment todo deprecated legacy upgrade migrate sqlite
postgres redis s3 bucket upload download storage disk filesystem symlink workspace
monorepo lockfile node npm yarn pnpm pip venv cargo crate rustc tsc webpack vite eslint
prettier ruff mypy pytest jest vitest playwright browser page dom css html layout grid flex
modal button form input dropdown tooltip navbar sidebar footer theme dark mode responsive
mobile frontend backend fullstack component components props state hook hooks render
rendering effect context provider reducer store selector query mutation fetch fetching
loader action validation validator schema types typing annotation generics lifetime borrow
ownership reference pointer nil null none undefined nan boolean integer float decimal
timestamp datetime timezone utc duration interval cron scheduler batch pagination cursor
filter sort search ranking score bm25 embedding vector index shard replica cluster node
pod kubernetes helm terraform aws gcp azure lambda function cloud region latency throughput
benchmark profile profiler regression performance optimization allocation allocations
heap garbage gc leak leaks concurrency parallel sequential race deadlock atomic channel
goroutine tokio runtime executor future futures closure iterator generator decorator macro
template interpolation regex pattern glob wildcard escape quote unicode utf8 ascii newline
whitespace indentation tab tabs spaces syntax semicolon bracket brace parenthesis operator
expression statement condition loop recursion stackoverflow overflow underflow precision
rounding truncation encoding decoding compression gzip zstd tar zip archive backup restore
snapshotting replication failover healthcheck readiness liveness probe metrics tracing
span spans telemetry opentelemetry prometheus grafana dashboard alert alerts oncall incident
outage rollback rollout canary feature flag experiment cohort analytics tracking consent
privacy gdpr pii redact redaction secret secrets credential credentials password hash salt
bcrypt jwt oauth oidc saml sso cookie csrf xss cors csp tls ssl certificate cert https http
grpc protobuf graphql rest websocket sse webhook webhooks queue kafka rabbitmq nats pubsub
topic partition consumer producer offset idempotent idempotency dedupe deduplication
debounce throttle backoff jitter circuit breaker fallback degrade graceful shutdown
startup bootstrap init initialization teardown cleanup setup fixture conftest harness
runner matrix workflow workflows action actions artifact artifacts cache caches
""")

# Verbs and nouns composed into identifiers (snake_case, camelCase) and class names.
ID_VERBS = _words("""
get set load save parse build create update delete remove add fetch send handle process
validate check compute render format convert apply find resolve init start stop run open
close read write flush sync merge split normalize sanitize encode decode serialize
deserialize register dispatch emit subscribe publish schedule retry cancel reset refresh
invalidate compile transform filter sort map reduce collect group count measure track report
notify ensure verify authorize authenticate connect disconnect bind attach detach mount
spawn wait poll drain enqueue dequeue lookup insert upsert select scan hash sign rotate expire
evict prefetch hydrate migrate seed backup restore export import list make to from with try
is has should can use on next prev clear copy clone compare diff patch replay rebuild reindex
""")

ID_NOUNS = _words("""
user account session token config settings options request response payload header body
message event handler job task worker queue item order invoice payment customer product cart
price discount coupon address profile avatar image file upload document report record entry
row column table schema query result error status state context cache store registry client
server connection pool socket stream buffer chunk frame packet route path url endpoint api
service provider manager controller factory builder parser lexer node tree graph edge cursor
page batch offset limit filter key value pair map list set index id timestamp date duration
interval timeout deadline retry policy rule permission role group team org project repo
branch commit build artifact release version manifest metadata plugin extension module
component widget view model field form input button modal dialog menu tab panel layout theme
style color font icon chart metric counter gauge histogram span trace logger level tenant
subscription plan quota usage billing webhook notification email template locale
translation currency region zone cluster shard replica snapshot checkpoint segment posting
document embedding vector score rank hit match turn thread agent tool prompt reply summary
""")

ADJECTIVES = _words("""
default active pending raw parsed cached remote local global internal public private max min
total current last next first new old stale dirty clean valid invalid safe async sync base
custom shared nested empty partial full legacy primary secondary
""")

TYPE_NAMES = {
    "python": (
        "str",
        "int",
        "float",
        "bool",
        "bytes",
        "dict[str, Any]",
        "list[str]",
        "Optional[str]",
        "Path",
        "datetime",
        "Sequence[int]",
        "Iterator[Row]",
        "Callable[[Event], None]",
    ),
    "typescript": (
        "string",
        "number",
        "boolean",
        "string[]",
        "Record<string, unknown>",
        "Promise<void>",
        "Date",
        "unknown",
        "ReactNode",
        "Map<string, number>",
        "Partial<Options>",
    ),
    "rust": (
        "String",
        "&str",
        "u32",
        "u64",
        "usize",
        "i64",
        "bool",
        "Vec<u8>",
        "Option<String>",
        "Result<()>",
        "HashMap<String, Value>",
        "Arc<Mutex<State>>",
        "PathBuf",
        "Duration",
    ),
    "go": (
        "string",
        "int",
        "int64",
        "bool",
        "[]byte",
        "error",
        "map[string]string",
        "time.Duration",
        "context.Context",
        "*http.Request",
        "[]string",
        "io.Reader",
    ),
}

MODULES = {
    "python": (
        "os",
        "sys",
        "json",
        "re",
        "time",
        "logging",
        "asyncio",
        "pathlib",
        "typing",
        "datetime",
        "dataclasses",
        "functools",
        "itertools",
        "collections",
        "subprocess",
        "sqlite3",
        "hashlib",
        "uuid",
        "base64",
        "contextlib",
        "tempfile",
        "shutil",
        "requests",
        "httpx",
        "pydantic",
        "fastapi",
        "sqlalchemy",
        "click",
        "numpy",
        "pandas",
        "pytest",
        "yaml",
        "orjson",
        "attrs",
    ),
    "typescript": (
        "react",
        "next/router",
        "zod",
        "axios",
        "express",
        "@tanstack/react-query",
        "lodash",
        "date-fns",
        "clsx",
        "vitest",
        "@testing-library/react",
        "node:fs",
        "node:path",
        "ws",
        "prisma",
        "@prisma/client",
        "jsonwebtoken",
        "pino",
    ),
    "rust": (
        "serde",
        "tokio",
        "anyhow",
        "thiserror",
        "clap",
        "reqwest",
        "tracing",
        "sqlx",
        "axum",
        "futures",
        "serde_json",
        "chrono",
        "uuid",
        "rand",
        "regex",
        "bytes",
        "hyper",
        "tower",
    ),
    "go": (
        "context",
        "fmt",
        "errors",
        "net/http",
        "encoding/json",
        "time",
        "sync",
        "os",
        "io",
        "strings",
        "strconv",
        "log/slog",
        "database/sql",
        "github.com/stretchr/testify/require",
        "go.uber.org/zap",
        "github.com/google/uuid",
        "golang.org/x/sync/errgroup",
    ),
}

EXTENSIONS = {"python": ".py", "typescript": ".ts", "rust": ".rs", "go": ".go"}
SOURCE_DIRS = {
    "python": (
        "src/{pkg}",
        "src/{pkg}/api",
        "src/{pkg}/core",
        "src/{pkg}/db",
        "src/{pkg}/services",
        "src/{pkg}/utils",
        "scripts",
    ),
    "typescript": (
        "src",
        "src/components",
        "src/hooks",
        "src/lib",
        "src/pages",
        "src/api",
        "src/utils",
        "server/routes",
        "server/services",
    ),
    "rust": ("src", "src/bin", "src/db", "src/http", "src/model", "crates/{pkg}-core/src"),
    "go": ("cmd/{pkg}", "internal/api", "internal/store", "internal/service", "internal/config", "pkg/{pkg}"),
}
TEST_DIRS = {"python": "tests", "typescript": "src/__tests__", "rust": "tests", "go": "internal/api"}
OTHER_FILES = (
    "README.md",
    "CHANGELOG.md",
    "Makefile",
    ".github/workflows/ci.yml",
    "docs/architecture.md",
    "Dockerfile",
    "docker-compose.yml",
    ".env.example",
)
PROJECT_FILES = {
    "python": ("pyproject.toml",),
    "typescript": ("package.json", "tsconfig.json"),
    "rust": ("Cargo.toml", "Cargo.lock"),
    "go": ("go.mod", "go.sum"),
}

PROJECT_WORDS = _words("""
payments billing ledger inventory checkout storefront catalog search indexer crawler scheduler
notifier mailer gateway proxy auth identity accounts dashboard admin portal analytics metrics
telemetry pipeline ingest etl warehouse reports invoicing webshop blog cms wiki chat realtime
sync backup archive media uploader thumbnailer transcoder player editor notebook playground
compiler linter formatter cli toolkit sdk client api core engine runtime worker queue cache
kv vault secrets config flags experiments tracker timesheet planner calendar booking
reservations fleet routing maps geo weather sensors iot firmware edge homelab infra ops
deploy terraform helm operator controller agent memstore tasks habits budget finance recipes
""")

USERS = ("dev", "alex", "sam", "jordan", "maria", "kim", "lee", "priya", "tom", "noor")
CODE_ROOTS = ("src", "code", "work", "projects", "repos", "git")

# Error messages, per language, with {ident}, {arg}, {cls}, {path}, {mod}, {n}, {m}, {word} slots.
ERRORS = {
    "python": (
        "TypeError: {ident}() missing 1 required positional argument: '{arg}'",
        "KeyError: '{arg}'",
        "AttributeError: 'NoneType' object has no attribute '{arg}'",
        "ValueError: invalid literal for int() with base 10: '{word}'",
        "ModuleNotFoundError: No module named '{mod}'",
        "AssertionError: assert {n} == {m}",
        "sqlite3.OperationalError: no such column: {arg}",
        "ImportError: cannot import name '{cls}' from '{mod}'",
        "FileNotFoundError: [Errno 2] No such file or directory: '{path}'",
        "json.decoder.JSONDecodeError: Expecting value: line 1 column {n} (char {m})",
        "TimeoutError: timed out after {n} seconds",
        "PermissionError: [Errno 13] Permission denied: '{path}'",
        "RuntimeError: Event loop is closed",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for {cls}",
        "sqlalchemy.exc.IntegrityError: UNIQUE constraint failed: {arg}s.{word}_id",
        "TypeError: unsupported operand type(s) for +: 'int' and 'NoneType'",
        "RecursionError: maximum recursion depth exceeded while calling a Python object",
        "UnicodeDecodeError: 'utf-8' codec can't decode byte 0x{m} in position {n}: invalid start byte",
    ),
    "typescript": (
        "error TS2322: Type 'string' is not assignable to type 'number'.",
        "error TS2339: Property '{arg}' does not exist on type '{cls}'.",
        "error TS2345: Argument of type 'string | undefined' is not assignable to parameter of type 'string'.",
        "error TS7006: Parameter '{arg}' implicitly has an 'any' type.",
        "error TS2307: Cannot find module '{mod}' or its corresponding type declarations.",
        "TypeError: Cannot read properties of undefined (reading '{arg}')",
        "ReferenceError: {ident} is not defined",
        "Error: Cannot find module '{mod}'",
        'Warning: Each child in a list should have a unique "key" prop.',
        "Error: connect ECONNREFUSED 127.0.0.1:{n}",
        "SyntaxError: Unexpected token '<', \"<!DOCTYPE \"... is not valid JSON",
        "Error: Hydration failed because the initial UI does not match what was rendered on the server.",
        "AxiosError: Request failed with status code {n}",
        "Unhandled Promise Rejection: TypeError: {ident} is not a function",
    ),
    "rust": (
        "error[E0308]: mismatched types",
        "error[E0425]: cannot find value `{arg}` in this scope",
        "error[E0599]: no method named `{ident}` found for struct `{cls}` in the current scope",
        "error[E0502]: cannot borrow `{arg}` as mutable because it is also borrowed as immutable",
        "error[E0277]: the trait bound `{cls}: Serialize` is not satisfied",
        "error[E0382]: borrow of moved value: `{arg}`",
        "error[E0433]: failed to resolve: use of undeclared type `{cls}`",
        "error[E0061]: this function takes {n} arguments but {m} arguments were supplied",
        "thread 'main' panicked at {path}:{n}:{m}:\ncalled `Option::unwrap()` on a `None` value",
        "thread 'tokio-runtime-worker' panicked at {path}:{n}:{m}:\nindex out of bounds: the len is {m} but the index is {n}",
        "warning: unused variable: `{arg}`",
        "error: could not compile `{word}` (lib) due to {n} previous errors",
    ),
    "go": (
        "undefined: {ident}",
        "cannot use {arg} (variable of type string) as int value in argument to {ident}",
        "panic: runtime error: invalid memory address or nil pointer dereference",
        "declared and not used: {arg}",
        "missing return",
        "context deadline exceeded",
        "too many arguments in call to {ident}",
        "{arg}.{ident} undefined (type *{cls} has no field or method {ident})",
        "panic: assignment to entry in nil map",
        "fatal error: all goroutines are asleep - deadlock!",
        "dial tcp 127.0.0.1:{n}: connect: connection refused",
        "json: cannot unmarshal string into Go struct field {cls}.{arg} of type int",
    ),
    "shell": (
        "bash: {word}: command not found",
        "fatal: not a git repository (or any of the parent directories): .git",
        "error: failed to push some refs to 'github.com:{word}/{arg}.git'",
        "npm ERR! code ERESOLVE",
        "Permission denied (publickey).",
        "curl: (7) Failed to connect to localhost port {n} after 0 ms: Connection refused",
        "No space left on device",
        "Killed",
        "make: *** [Makefile:{n}: test] Error 1",
        "error: Your local changes to the following files would be overwritten by checkout:\n\t{path}",
        "CONFLICT (content): Merge conflict in {path}",
    ),
}

# How users open a request (the rest of the prompt is prose about the project).
PROMPT_OPENERS = _words("""
fix add implement refactor update remove rename investigate debug explain review write
migrate optimize simplify document test clean move split extract replace upgrade check
""")
PROMPT_TEMPLATES = (
    "{verb} {thing} in {path}",
    "can you {verb} {thing}? {sentence}",
    "the {noun} tests are failing after my last change, {verb} it",
    "why does `{ident}` {word2} when {noun} is empty?",
    "{verb} the {noun} {word2} so that {sentence}",
    "I'm getting this error:\n\n```\n{error}\n```\n\n{sentence}",
    "look at {path} and {verb} {thing}",
    "{sentence} {sentence}",
    "run the tests and {verb} whatever fails",
    "{verb} `{ident}` to use {noun} instead of {noun2}",
    "please {verb} {thing}. {sentence} {sentence}",
    "we need {thing}. {sentence}",
    "commit this",
    "continue",
    "yes, go ahead",
    "what does {path} do?",
)

SLASH_COMMANDS = ("/clear", "/compact", "/model", "/cost", "/init", "/review", "/status", "/memory")
CLAUDE_MODELS = (
    "claude-sonnet-4-5-20250929",
    "claude-opus-4-1-20250805",
    "claude-haiku-4-5-20251001",
    "claude-opus-4-5-20251101",
    "claude-sonnet-4-20250514",
)
CODEX_MODELS = ("gpt-5-codex", "gpt-5", "gpt-5.1-codex", "gpt-5.2-codex", "gpt-5.3-codex", "gpt-5.1-codex-mini")
MCP_TOOLS = (
    ("github", "get_issue"),
    ("github", "list_pull_requests"),
    ("github", "create_pull_request"),
    ("linear", "get_issue"),
    ("linear", "search_issues"),
    ("sentry", "get_issue_events"),
    ("postgres", "query"),
    ("context7", "get-library-docs"),
    ("playwright", "browser_snapshot"),
    ("filesystem", "read_text_file"),
)
SUBAGENT_TYPES = ("Explore", "general-purpose", "Plan", "code-reviewer", "test-runner")


def inflections(verb: str) -> tuple[str, str, str]:
    """A regular English verb's third person, past and -ing forms (close enough for the rare
    irregular one: the point is a realistic spread of distinct tokens, not grammar)."""
    if verb.endswith("e") and not verb.endswith("ee"):
        return verb + "s", verb + "d", verb[:-1] + "ing"
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        return verb + "es", verb + "ed", verb + "ing"
    if verb.endswith("y") and len(verb) > 2 and verb[-2] not in "aeiou":
        return verb[:-1] + "ies", verb[:-1] + "ied", verb + "ing"
    return verb + "s", verb + "ed", verb + "ing"
