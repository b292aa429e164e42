// Hatchery's in-sandbox Java kernel: run_code in `java` contexts.
//
// Started by the agent as `java ... --source 17 /dev/fd/5` (this source on
// fd 5, so nothing is written to the sandbox's disk), with the same pipes as
// the other kernels: requests on fd 3, events on fd 4, one JSON object a
// line. Cells are evaluated by the JDK's JShell API with its local
// execution engine: in this JVM, so System.out of a cell is ours and a cell
// costs no second process. Variables, methods and classes persist between
// runs, as in a notebook. A run's env (the sandbox's envs and the run's
// own) is visible as System properties for that run only, as in E2B's Java
// kernel (a JVM cannot change its own environment).
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import java.util.stream.Collectors;
import jdk.jshell.*;

public class java_kernel {
    static final Object LOCK = new Object();
    static OutputStream events;
    // The run in progress; output between runs carries no id (dropped).
    static volatile Long current = null;

    static String quote(String s) {
        StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
            }
        }
        return b.append('"').toString();
    }

    static void emit(String json) {
        byte[] line = (json + "\n").getBytes(StandardCharsets.UTF_8);
        synchronized (LOCK) {
            try {
                events.write(line);
                events.flush();
            } catch (IOException e) {
                // The agent is gone: nothing to report to.
                Runtime.getRuntime().halt(1);
            }
        }
    }

    static String idJson() {
        Long id = current;
        return id == null ? "null" : id.toString();
    }

    // A cell's System.out or System.err: every write is one event of the run.
    static final class Stream extends OutputStream {
        final String kind;
        Stream(String kind) { this.kind = kind; }
        @Override public void write(int b) { write(new byte[] {(byte) b}, 0, 1); }
        @Override public void write(byte[] b, int off, int len) {
            if (len == 0) return;
            String text = new String(b, off, len, StandardCharsets.UTF_8);
            emit("{\"id\":" + idJson() + ",\"type\":\"" + kind + "\",\"text\":" + quote(text) + "}");
        }
    }

    // A minimal JSON reader for the agent's request lines.
    static final class Json {
        final String s;
        int i = 0;
        Json(String s) { this.s = s; }
        void ws() { while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++; }
        Object value() {
            ws();
            char c = s.charAt(i);
            if (c == '{') {
                Map<String, Object> m = new LinkedHashMap<>();
                i++; ws();
                if (s.charAt(i) == '}') { i++; return m; }
                while (true) {
                    ws();
                    String k = (String) value();
                    ws(); expect(':');
                    m.put(k, value());
                    ws();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect('}');
                    return m;
                }
            }
            if (c == '[') {
                List<Object> l = new ArrayList<>();
                i++; ws();
                if (s.charAt(i) == ']') { i++; return l; }
                while (true) {
                    l.add(value()); ws();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect(']');
                    return l;
                }
            }
            if (c == '"') return string();
            if (s.startsWith("null", i)) { i += 4; return null; }
            if (s.startsWith("true", i)) { i += 4; return true; }
            if (s.startsWith("false", i)) { i += 5; return false; }
            int st = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            return Double.parseDouble(s.substring(st, i));
        }
        void expect(char c) {
            if (s.charAt(i) != c) throw new IllegalArgumentException("expected " + c + " at " + i);
            i++;
        }
        String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c != '\\') { b.append(c); continue; }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break;
                    case 'r': b.append('\r'); break;
                    case 't': b.append('\t'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'u': b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; break;
                    default: b.append(e);
                }
            }
        }
    }

    static void error(String name, String value, String traceback) {
        System.out.flush();
        System.err.flush();
        emit("{\"id\":" + idJson() + ",\"type\":\"error\",\"name\":" + quote(name) + ",\"value\":"
                + quote(value == null ? "" : value) + ",\"traceback\":" + quote(traceback) + "}");
    }

    // Whether a snippet is an expression whose value a notebook shows.
    static boolean shows(Snippet sn) {
        switch (sn.subKind()) {
            case TEMP_VAR_EXPRESSION_SUBKIND:
            case VAR_VALUE_SUBKIND:
            case OTHER_EXPRESSION_SUBKIND:
                return true;
            default:
                return false;
        }
    }

    // Evaluates a cell snippet by snippet; false once one failed.
    static boolean runCell(JShell js, String code) {
        SourceCodeAnalysis sca = js.sourceCodeAnalysis();
        String rest = code;
        String lastValue = null;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
            String src = ci.source();
            if (ci.completeness() == SourceCodeAnalysis.Completeness.EMPTY) break;
            if (src == null || !ci.completeness().isComplete()) {
                // An unfinished last statement: JShell reports what is wrong.
                src = rest;
                rest = "";
            } else {
                rest = ci.remaining();
            }
            lastValue = null;
            for (SnippetEvent ev : js.eval(src)) {
                if (ev.causeSnippet() != null) continue; // a dependant's update
                if (ev.status() == Snippet.Status.REJECTED) {
                    String msg = js.diagnostics(ev.snippet())
                            .map(d -> d.getMessage(Locale.ROOT))
                            .collect(Collectors.joining("\n"));
                    error("CompilationError", msg, msg + "\n");
                    return false;
                }
                if (ev.exception() != null) {
                    Throwable t = ev.exception();
                    String name = t instanceof EvalException
                            ? ((EvalException) t).getExceptionClassName()
                            : t.getClass().getName();
                    if (t instanceof UnresolvedReferenceException) {
                        name = "UnresolvedReferenceException";
                    }
                    StringWriter sw = new StringWriter();
                    t.printStackTrace(new PrintWriter(sw));
                    String tb = sw.toString();
                    if (t instanceof EvalException) tb = name + ": " + t.getMessage() + "\n" + tb.substring(tb.indexOf('\n') + 1);
                    error(name, t.getMessage(), tb);
                    return false;
                }
                if (shows(ev.snippet()) && ev.value() != null) lastValue = ev.value();
            }
        }
        if (lastValue != null) {
            System.out.flush();
            System.err.flush();
            emit("{\"id\":" + idJson() + ",\"type\":\"result\",\"is_main_result\":true,\"data\":{\"text/plain\":"
                    + quote(lastValue) + "}}");
        }
        return true;
    }

    @SuppressWarnings("unchecked")
    public static void main(String[] args) throws Exception {
        events = new FileOutputStream("/dev/fd/4");
        BufferedReader requests = new BufferedReader(
                new InputStreamReader(new FileInputStream("/dev/fd/3"), StandardCharsets.UTF_8));
        // Subclasses: PrintStream itself writes println's text and line end
        // in one write since JDK 17, a subclass in two, as E2B's Java kernel
        // reports them (its first stdout chunk is "Hello, World!").
        System.setOut(new PrintStream(new Stream("stdout"), true, StandardCharsets.UTF_8) {});
        System.setErr(new PrintStream(new Stream("stderr"), true, StandardCharsets.UTF_8) {});
        JShell js = JShell.builder().executionEngine("local").build();
        // JShell's own default imports; compiling them warms the compiler
        // before the first cell.
        js.eval("import java.io.*; import java.math.*; import java.net.*; import java.nio.file.*; "
                + "import java.util.*; import java.util.concurrent.*; import java.util.function.*; "
                + "import java.util.regex.*; import java.util.stream.*;");
        emit("{\"type\":\"ready\",\"pid\":" + ProcessHandle.current().pid() + ",\"language\":\"java\"}");
        long count = 0;
        String line;
        while ((line = requests.readLine()) != null) {
            Map<String, Object> req;
            try {
                req = (Map<String, Object>) new Json(line).value();
                if (!(req.get("code") instanceof String)) throw new IllegalArgumentException("'code' must be a string");
            } catch (RuntimeException e) {
                current = null;
                error("KernelError", "malformed request: " + e, "");
                emit("{\"id\":null,\"type\":\"done\",\"execution_count\":" + count + "}");
                continue;
            }
            Object id = req.get("id");
            current = id instanceof Double ? ((Double) id).longValue() : null;
            count++;
            Map<String, Object> env = req.get("env") instanceof Map ? (Map<String, Object>) req.get("env") : Map.of();
            if (req.get("chdir") instanceof String) {
                // A JVM cannot change its working directory; user.dir is
                // what Java code reads it from.
                System.setProperty("user.dir", (String) req.get("chdir"));
            }
            Map<String, String> saved = new HashMap<>();
            for (Map.Entry<String, Object> e : env.entrySet()) {
                if (e.getKey().isEmpty() || !(e.getValue() instanceof String)) continue;
                saved.put(e.getKey(), System.getProperty(e.getKey()));
                System.setProperty(e.getKey(), (String) e.getValue());
            }
            try {
                runCell(js, (String) req.get("code"));
            } catch (RuntimeException e) {
                error("KernelError", e.toString(), "");
            } finally {
                // The env was for this run only.
                for (Map.Entry<String, String> e : saved.entrySet()) {
                    if (e.getValue() == null) System.clearProperty(e.getKey());
                    else System.setProperty(e.getKey(), e.getValue());
                }
                System.out.flush();
                System.err.flush();
                emit("{\"id\":" + idJson() + ",\"type\":\"done\",\"execution_count\":" + count + "}");
                current = null;
            }
        }
        Runtime.getRuntime().halt(0);
    }
}
