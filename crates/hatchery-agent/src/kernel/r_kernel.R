# Hatchery's in-sandbox R kernel: run_code in `r` contexts.
#
# Started by the agent as `Rscript --vanilla /dev/fd/5` (this source on fd 5,
# nothing written to the sandbox's disk), with the same pipes as the other
# kernels: requests on fd 3, events on fd 4, one JSON object a line. A run's
# top-level expressions are evaluated one by one in the global environment
# with R's own eval and withVisible: a visible value is printed as the R
# console prints it, the last expression's as the run's main result (its
# text as print() gives it). A run's env (the sandbox's envs and the run's
# own) is set with Sys.setenv for that run only.

# The kernel's own functions live in an environment under base, not under
# the global environment, so a run that redefines paste0 or flush there
# does not break the kernel.
local({
  requests <- file("/dev/fd/3", open = "r", encoding = "UTF-8")
  events <- file("/dev/fd/4", open = "w", encoding = "UTF-8")
  # R writes its console output piece by piece ("[1]", " 6", "\n"), each
  # straight to the pipe, and R's file connections on a pipe are
  # unbuffered: what a top-level expression prints is collected (a sink to
  # a raw connection) and sent as one stdout event when the expression
  # ends, as E2B's R kernel (IRkernel) sends it ('[1] "Hello, World!"\n').
  # Output of R's child processes (system()) goes to the pipe directly.
  captured <- NULL
  sinks <- 0L
  capture_start <- function() {
    sinks <<- sink.number()
    captured <<- rawConnection(raw(0), "w")
    sink(captured)
  }
  capture_end <- function() {
    # A run may have pushed sinks of its own, or popped ours.
    while (sink.number() > sinks) sink()
    bytes <- rawConnectionValue(captured)
    close(captured)
    captured <<- NULL
    if (length(bytes)) {
      text <- rawToChar(bytes[bytes != as.raw(0L)])
      Encoding(text) <- "UTF-8"
      emit("\"type\":\"stdout\",\"text\":", json_str(text))
    }
  }
  current <- "null"

  json_str <- function(s) {
    s <- enc2utf8(as.character(s))
    s <- gsub("\\", "\\\\", s, fixed = TRUE)
    s <- gsub("\"", "\\\"", s, fixed = TRUE)
    s <- gsub("\n", "\\n", s, fixed = TRUE)
    s <- gsub("\r", "\\r", s, fixed = TRUE)
    s <- gsub("\t", "\\t", s, fixed = TRUE)
    # Other control characters as \u escapes.
    m <- gregexpr("[\001-\037]", s, useBytes = TRUE)
    regmatches(s, m) <- lapply(regmatches(s, m), function(x)
      vapply(x, function(ch) sprintf("\\u%04x", utf8ToInt(ch)), ""))
    paste0("\"", s, "\"")
  }

  emit <- function(...) {
    writeLines(paste0("{\"id\":", current, ",", ..., "}"), events, useBytes = TRUE)
    flush(events)
  }

  flush_out <- function() {
    flush(stdout())
    flush(stderr())
  }

  # The agent's request line: an object of strings, a number, null and an
  # object of strings.
  parse_json <- function(line) {
    toks <- regmatches(line, gregexpr(
      "\"(?:[^\"\\\\]++|\\\\.)*+\"|-?[0-9][0-9.eE+-]*|null|true|false|[][{}:,]",
      line, perl = TRUE))[[1]]
    i <- 0L
    nxt <- function() {
      i <<- i + 1L
      if (i > length(toks)) stop("unexpected end of request")
      toks[[i]]
    }
    value <- function() {
      t <- nxt()
      if (t == "{") {
        out <- list()
        if (toks[[i + 1L]] == "}") {
          nxt()
          return(out)
        }
        repeat {
          k <- str_value(nxt())
          if (nxt() != ":") stop("expected ':'")
          out[k] <- list(value())
          t <- nxt()
          if (t == "}") return(out)
          if (t != ",") stop("expected ',' or '}'")
        }
      }
      if (t == "[") {
        out <- list()
        if (toks[[i + 1L]] == "]") {
          nxt()
          return(out)
        }
        repeat {
          out[length(out) + 1L] <- list(value())
          t <- nxt()
          if (t == "]") return(out)
        }
      }
      if (startsWith(t, "\"")) return(str_value(t))
      if (t == "null") return(NULL)
      if (t == "true") return(TRUE)
      if (t == "false") return(FALSE)
      as.numeric(t)
    }
    str_value <- function(t) {
      if (!startsWith(t, "\"")) stop("expected a string")
      t <- substr(t, 2L, nchar(t) - 1L)
      if (!grepl("\\", t, fixed = TRUE)) return(t)
      # R's parser would decode JSON's escapes too, but refuses a string
      # of over 10000 characters with a \u escape in it.
      m <- gregexpr("\\\\(u[0-9a-fA-F]{4}|.)", t, perl = TRUE)
      regmatches(t, m) <- list(vapply(regmatches(t, m)[[1L]], function(e) {
        switch(substr(e, 2L, 2L),
               n = "\n", t = "\t", r = "\r", b = "\b", f = "\f",
               u = {
                 ch <- intToUtf8(strtoi(substr(e, 3L, 6L), 16L))
                 if (is.na(ch)) "\ufffd" else ch
               },
               substr(e, 2L, 2L))
      }, "", USE.NAMES = FALSE))
      t
    }
    value()
  }

  error_event <- function(name, value, traceback) {
    flush_out()
    emit("\"type\":\"error\",\"name\":", json_str(name), ",\"value\":", json_str(value),
         ",\"traceback\":", json_str(traceback))
  }

  # Printed from the global environment, as R's console prints, so print
  # methods defined there are found.
  print_global <- function(value) eval(quote(base::print(value)), list(value = value), globalenv())

  shown <- function(value) {
    paste(utils::capture.output(print_global(value)), collapse = "\n")
  }

  # Evaluates one run's code; FALSE once an expression failed.
  run_cell <- function(code) {
    exprs <- tryCatch(parse(text = code, keep.source = FALSE, encoding = "UTF-8"),
                      error = function(e) e)
    if (inherits(exprs, "error")) {
      msg <- conditionMessage(exprs)
      error_event("SyntaxError", msg, paste0("Error: ", msg, "\n"))
      return(FALSE)
    }
    n <- length(exprs)
    for (j in seq_len(n)) {
      capture_start()
      res <- tryCatch(
        withCallingHandlers(
          withVisible(eval(exprs[[j]], envir = globalenv())),
          warning = function(w) {
            message("Warning message:\n", conditionMessage(w))
            invokeRestart("muffleWarning")
          }
        ),
        error = function(e) e
      )
      if (!inherits(res, "error") && res$visible && j < n) {
        res <- tryCatch({
          print_global(res$value)
          res
        }, error = function(e) e)
      }
      capture_end()
      if (inherits(res, "error")) {
        msg <- conditionMessage(res)
        call <- conditionCall(res)
        # stop() at a cell's top level names the kernel's eval.
        if (identical(call, quote(eval(exprs[[j]], envir = globalenv())))) call <- NULL
        head <- if (is.null(call)) "Error: " else
          paste0("Error in ", paste(deparse(call, nlines = 1L), collapse = ""), ": ")
        error_event(class(res)[[1L]], msg, paste0(head, msg, "\n"))
        return(FALSE)
      }
      if (res$visible && j == n) {
        text <- tryCatch(shown(res$value), error = function(e) e)
        if (inherits(text, "error")) {
          error_event(class(text)[[1L]], conditionMessage(text), "")
          return(FALSE)
        }
        flush_out()
        emit("\"type\":\"result\",\"is_main_result\":true,\"data\":{\"text/plain\":",
             json_str(text), "}")
      }
      flush_out()
    }
    TRUE
  }

  writeLines(paste0("{\"type\":\"ready\",\"pid\":", Sys.getpid(), ",\"language\":\"r\"}"), events)
  flush(events)
  count <- 0L
  repeat {
    line <- readLines(requests, n = 1L, warn = FALSE)
    if (length(line) == 0L) break
    req <- tryCatch(parse_json(line), error = function(e) e)
    if (inherits(req, "error") || !is.character(req$code)) {
      current <- "null"
      error_event("KernelError", paste("malformed request:",
        if (inherits(req, "error")) conditionMessage(req) else "'code' must be a string"), "")
      emit("\"type\":\"done\",\"execution_count\":", count)
      next
    }
    current <- if (is.numeric(req$id)) format(req$id, scientific = FALSE) else "null"
    count <- count + 1L
    if (is.character(req$chdir)) try(setwd(req$chdir), silent = TRUE)
    env <- Filter(is.character, req$env)
    env <- env[nzchar(names(env))]
    saved <- if (length(env)) Sys.getenv(names(env), unset = NA, names = TRUE) else character()
    if (length(env)) do.call(Sys.setenv, env)
    tryCatch(run_cell(req$code), error = function(e)
      error_event("KernelError", conditionMessage(e), ""))
    # The env was for this run only.
    for (k in names(saved)) {
      if (is.na(saved[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, stats::setNames(list(saved[[k]]), k))
    }
    flush_out()
    emit("\"type\":\"done\",\"execution_count\":", count)
    current <- "null"
  }
}, envir = new.env(parent = baseenv()))
