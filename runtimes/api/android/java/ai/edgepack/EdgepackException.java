package ai.edgepack;

/**
 * A failed call into the edgepack runtime. The message is the native runtime's own
 * ({@code ep_last_error()} of the C API), for example
 * {@code input 0 'input' needs 602112 bytes (float32 [1,3,224,224]), got 40}.
 *
 * <p>The status is the C API's {@code ep_status} code; the constants below name them.
 */
public class EdgepackException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** NULL handle or pointer, closed model, bad argument value. */
  public static final int INVALID_ARGUMENT = 1;
  /** Model or metadata file missing; unknown tensor name. */
  public static final int NOT_FOUND = 2;
  /** Library cannot be loaded: wrong architecture, not a model. */
  public static final int LOAD = 3;
  /** Metadata missing, malformed, or not matching the model. */
  public static final int METADATA = 4;
  /** Input/output index out of range. */
  public static final int INDEX = 5;
  /** Shape or byte size does not match the model. */
  public static final int SHAPE = 6;
  /** Dtype does not match the model. */
  public static final int DTYPE = 7;
  /** Call not valid now (e.g. run before all inputs are set). */
  public static final int STATE = 8;
  /** The TVM runtime reported an error. */
  public static final int RUNTIME = 9;
  /** Allocation failed. */
  public static final int NO_MEMORY = 10;
  /** Reading or writing a file failed. */
  public static final int IO = 11;

  private static final String[] NAMES = {
    "EP_OK", "EP_ERR_INVALID_ARGUMENT", "EP_ERR_NOT_FOUND", "EP_ERR_LOAD", "EP_ERR_METADATA",
    "EP_ERR_INDEX", "EP_ERR_SHAPE", "EP_ERR_DTYPE", "EP_ERR_STATE", "EP_ERR_RUNTIME",
    "EP_ERR_NO_MEMORY", "EP_ERR_IO"
  };

  /** The {@code ep_status} code of the failure. */
  private final int status;

  /**
   * Creates an exception (the JNI layer calls this with the C API's message and status).
   *
   * @param message what went wrong, as the native runtime reports it
   * @param status the {@code ep_status} code, one of the constants of this class
   */
  public EdgepackException(String message, int status) {
    super(message);
    this.status = status;
  }

  /**
   * Creates an exception with a cause (used when a file operation of the Java layer fails).
   *
   * @param message what went wrong
   * @param status the {@code ep_status} code, one of the constants of this class
   * @param cause the underlying exception
   */
  public EdgepackException(String message, int status, Throwable cause) {
    super(message, cause);
    this.status = status;
  }

  /**
   * Returns the C API status code of the failure.
   *
   * @return one of {@link #INVALID_ARGUMENT}, {@link #NOT_FOUND}, ... {@link #IO}
   */
  public int getStatus() {
    return status;
  }

  /**
   * Returns the C API name of the status, for example {@code "EP_ERR_SHAPE"}.
   *
   * @return the status name, {@code "EP_ERR_UNKNOWN"} for a code this class does not know
   */
  public String getStatusName() {
    return status >= 0 && status < NAMES.length ? NAMES[status] : "EP_ERR_UNKNOWN";
  }

  /**
   * Returns the class name, the status name and the native message.
   *
   * @return e.g. {@code ai.edgepack.EdgepackException [EP_ERR_SHAPE]: input 0 ...}
   */
  @Override
  public String toString() {
    return getClass().getName() + " [" + getStatusName() + "]: " + getMessage();
  }
}
