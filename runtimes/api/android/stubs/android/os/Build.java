package android.os;

/**
 * Compile-time stand-in for android.os.Build. SUPPORTED_ABIS is not a compile-time constant, so
 * code compiled against this stub reads the real field on a device. On a host JVM (tests) it
 * comes from the system property edgepack.stub.abis (comma-separated, default arm64-v8a).
 */
public class Build {
  /** ABIs the device supports, preferred first. */
  public static final String[] SUPPORTED_ABIS =
      System.getProperty("edgepack.stub.abis", "arm64-v8a").split(",");
}
